"""The CLI as a newcomer types it, against a real local federation (`atoll poc up`): a fixture
that runs `python -m atoll ...` with its own ATOLL_HOME and poc workspace, and stops what it
started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


class Cli:
    def __init__(self, tmp_path: Path):
        self.cwd = tmp_path
        self.workspace = tmp_path / "poc"
        self.env = {**os.environ, "ATOLL_HOME": str(tmp_path / "home"),
                    "ATOLL_POC_WORKSPACE": str(self.workspace)}
        self.env.pop("ATOLL_KIT", None)  # a newcomer's shell names no kit

    def __call__(self, *args: str, check: bool = True, timeout: float = 300
                 ) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "atoll", *args], env=self.env, cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"atoll {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def json(self, *args: str):
        return json.loads(self(*args, "--format", "json").stdout)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "atoll", *args], env=self.env,
                                cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def workspace_processes(self) -> list[int]:
        """Live processes whose command line names a path of the workspace (read from /proc
        here, independently of what atoll itself records)."""
        root = str(self.workspace) + "/"
        found = []
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if entry.name.isdigit() and root in argv and state != "Z":
                found.append(int(entry.name))
        return found


@pytest.fixture
def cli(tmp_path):
    runner = Cli(tmp_path)
    yield runner
    if runner.workspace.exists():
        runner("poc", "down", check=False)
