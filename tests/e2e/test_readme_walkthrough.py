"""The README's walkthrough, run as a newcomer types it: its commands, read from README.md, in
order, on a fresh workspace, with the `atoll` of this checkout. The Python API example of
docs/python-api.md runs too, while the federation is up. When the README drifts from what the
commands do, this test fails."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- walkthrough:"


def readme_commands() -> list[str]:
    """The commands of the README's walkthrough block, comments taken off."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block is not None, "README.md: no ```bash block after the walkthrough marker"
    commands = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(" ".join(shlex.quote(w) if w != "<JOB_ID>" else w for w in words))
    return commands


def python_api_example() -> str:
    text = (ROOT / "docs" / "python-api.md").read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_the_readme_walkthrough_runs_as_written(tmp_path):
    commands = readme_commands()
    assert commands[0].startswith("atoll poc up") and commands[-1] == "atoll poc down"
    env = {**os.environ, "ATOLL_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("ATOLL_POC_WORKSPACE", None)  # the README's defaults, under this ATOLL_HOME
    env.pop("ATOLL_KIT", None)
    job_id = None
    outputs: dict[str, str] = {}

    def run(command: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, shell=True, env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=240, **kwargs)

    try:
        for command in commands:
            if command == "atoll poc down":  # the Python API while the federation is up
                example = run(f"{shlex.quote(sys.executable)} -", input=python_api_example())
                assert example.returncode == 0, example.stdout + example.stderr
                assert re.search(r"^online: \['site-1', 'site-2'\]$", example.stdout, re.M)
                assert " FINISHED:COMPLETED" in example.stdout
                assert list((tmp_path / "api-results").glob("*/results/summary.json"))
            if "<JOB_ID>" in command:
                assert job_id, f"{command}: no job id yet (the walkthrough lists jobs first)"
                command = command.replace("<JOB_ID>", job_id)
            done = run(command)
            assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stdout + done.stderr, command
            outputs[command] = done.stdout
            if command == "atoll job list":
                listed = run("atoll job list --format json")
                job_id = json.loads(listed.stdout)[0]["job_id"]
                assert job_id in done.stdout  # the id the reader copies is on screen
    finally:
        run("atoll poc down")

    submitted = next(out for cmd, out in outputs.items() if cmd.startswith("atoll job submit"))
    assert "FINISHED:COMPLETED" in submitted
    assert re.findall(r"^  round (\d+):", submitted, re.M) == ["1", "2", "3", "4", "5"]
    assert "site-1" in outputs["atoll site list"] and "online" in outputs["atoll site list"]
    results = tmp_path / "results" / job_id / "results"
    for name in ("training_curves.png", "metrics.csv", "summary.json",
                 "global_model_final.safetensors"):
        assert (results / name).is_file(), name
