"""A real federation for tests: provisioned kits, parents as separate processes, real mTLS."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll.admin.session import Session
from atoll.pki.project import parse_project
from atoll.pki.provision import provision

PROJECT = "fedtest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def project_doc(port: int, sites: list[str], users: list[dict[str, str]],
                studies: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": PROJECT,
        "server": {"name": "server", "host": "127.0.0.1", "port": port},
        "sites": [{"name": s, "org": f"org-{s}"} for s in sites],
        "users": users,
        "studies": studies or {},
    }


@dataclass
class Federation:
    root: Path
    sites: list[str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    studies: dict[str, Any] = field(default_factory=dict)  # as provisioned

    @classmethod
    def provisioned(cls, tmp: Path, sites: list[str], users: list[dict[str, str]],
                    studies: dict[str, Any] | None = None,
                    runtime: dict[str, str] | None = None) -> Federation:
        doc = project_doc(free_port(), sites, users, studies)
        provision(parse_project(doc, "test"), tmp)
        fed = cls(tmp / PROJECT, sites, studies=studies or {})
        for site in sites:
            text = (runtime or {}).get(site, "format_version: 2\nstudies:\n  default: {}\n")
            (fed.kit(site) / "local" / "study_runtime.yaml").write_text(text)
        return fed

    def kit(self, name: str) -> Path:
        return self.root / name

    def workspace(self, name: str) -> Path:
        return self.kit(name) / "workspace"

    def _start(self, role: str, name: str, timeout: float = 30.0,
               env: dict[str, str] | None = None) -> subprocess.Popen:
        ready = self.root / f"{name}.ready"
        ready.unlink(missing_ok=True)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "atoll", role, "start", str(self.kit(name)),
             "--ready-file", str(ready)], stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, **(env or {})})
        self.procs[name] = proc
        deadline = time.monotonic() + timeout
        while not (ready.exists() and ready.stat().st_size):
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.log(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready:\n{self.log(name)}")
            time.sleep(0.02)
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def start_server(self, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self._start("server", "server", env=env)

    def start_site(self, site: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return self._start("site", site, env=env)

    def start_all(self) -> None:
        self.start_server()
        for site in self.sites:
            self.start_site(site)

    def session(self, user: str, study: str | None = None) -> Session:
        return Session(self.kit(user), study=study)

    def wait_online(self, user: str, sites: list[str] | None = None, study: str | None = None,
                    timeout: float = 20.0) -> None:
        if study is None and self.studies:  # no `default` study holds them all: each study's
            for name, members in self.studies.items():
                enrolled = [x for x in sites or self.sites if x in members.get("sites", [])]
                if enrolled:
                    self.wait_online(user, enrolled, name, timeout)
            return
        wanted = set(sites or self.sites)
        with self.session(user) as s:
            deadline = time.monotonic() + timeout
            while True:
                online = {x["name"] for x in s.sites(study)["sites"] if x["online"]}
                if wanted <= online:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sites online: {sorted(online)}, wanted {sorted(wanted)}")
                time.sleep(0.05)

    def kill(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name in [n for n in self.procs if n != "server"]:
            self.kill(name)
        self.kill("server")


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", poll: float = 0.05):
    """The predicate's first true value, polled until ``timeout``; TimeoutError names ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out waiting for {what}")


def found(root: Path, name: str) -> list[Path]:
    """The files or folders called ``name`` under ``root``, read while the parents write there:
    a folder that goes while it is walked (a site's fetch in progress) is passed over, where
    ``Path.rglob`` would raise."""
    return [Path(top) / name for top, dirs, files in os.walk(root) if name in dirs or name in files]


def wait_checkpointed(fed: Federation, user: str, job_id: str, round_: int,
                      timeout: float = 120.0) -> None:
    """Wait until the server has recorded the job's checkpoint of ``round_``: its worker commits
    it in the background while the next round's tasks go out, so a site holding that next round
    does not yet mean a restart would resume after ``round_``."""
    with fed.session(user) as s:  # one session for the whole wait
        wait_for(lambda: any(e.get("event") == "checkpoint" and e.get("source") == "server"
                             and e.get("round") == round_ for e in s.logs(job_id)["events"]),
                 timeout, f"the checkpoint of round {round_}", poll=0.2)


def job_folder(path: Path, meta: dict[str, Any], app_yaml: str, files: dict[str, str]) -> Path:
    """Write a job folder: meta.json, app/app.yaml and the app's files."""
    (path / "app").mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "app" / "app.yaml").write_text(app_yaml)
    for name, text in files.items():
        (path / "app" / name).write_text(text)
    return path


def pids_with_env(marker: str, sandboxes: bool = False) -> list[int]:
    """Processes whose environment holds `marker` (e.g. ATOLL_JOB_ID=<id>): a job's workers,
    and with `sandboxes` also the bwrap processes that hold each worker's namespaces."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            comm = (entry / "comm").read_bytes().strip()
        except OSError:
            continue
        if marker.encode() in env.split(b"\0") and (sandboxes or comm != b"bwrap"):
            found.append(int(entry.name))
    return [p for p in found if p != os.getpid()]
