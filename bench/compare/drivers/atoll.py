"""atoll in deployment mode: a server parent and two site parents as separate processes, mTLS.

Uses atoll's own tools only: `atoll provision` for the CA and the kits, `atoll server start` /
`atoll site start` in the foreground (so the harness tags and measures them, and their job
workers with them), the `atoll job submit|list|abort` CLI as a user runs it, and one
`atoll.session.Session` per poll loop (bench/compare/atoll/ctl.py) to watch readiness and job
status. ATOLL_HOME points into the run's work folder so no saved login of the user is used.
Mutual TLS is always on in atoll; every job worker runs through the process launcher.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from proctree import Proc, ProcessTable, _stat

from drivers.base import (
    COMPARE_DIR,
    REPO,
    Driver,
    DriverError,
    JobRun,
    free_port_block,
    layer_elems,
)
from drivers.flare import _last_json

ATOLL_DIR = COMPARE_DIR / "atoll"
VENV = REPO / ".venv"
ADMIN = "admin@bench.local"
SITES = ("site-1", "site-2")

PROJECT_YAML = """\
name: bench
server: {{name: server, host: 127.0.0.1, port: {port}}}
sites:
{sites}
users:
  - {{name: {admin}, org: bench, role: project_admin}}
"""


class AtollDriver(Driver):
    name = "atoll"
    title = "atoll"
    _compiled = False  # src/ byte-compiled once per run

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.python = str(VENV / "bin" / "python")
        self.atoll = str(VENV / "bin" / "atoll")
        self.port = 0
        self.table = WorkerAwareTable(self.tag)

    @property
    def kits(self) -> Path:
        return self.workdir / "kits" / "bench"

    @property
    def admin_kit(self) -> Path:
        return self.kits / ADMIN

    def missing(self) -> str | None:
        if not Path(self.atoll).exists():
            return f"{self.atoll} is missing: run `make test` or `make demo` once to create .venv"
        return None

    def system_env(self) -> dict[str, str]:
        return {"ATOLL_HOME": str(self.workdir / "home")}

    # -- deployment --------------------------------------------------------------------
    def prepare(self) -> None:
        self._byte_compile()
        (self.workdir / "home").mkdir(parents=True, exist_ok=True)
        self.port = free_port_block(1, start=30000)
        project = self.workdir / "project.yaml"
        project.write_text(
            PROJECT_YAML.format(
                port=self.port,
                admin=ADMIN,
                sites="\n".join(f"  - {{name: {s}, org: org-{s[-1]}}}" for s in SITES),
            )
        )
        self.run_cmd(
            [self.atoll, "provision", str(project), "--out", str(self.workdir / "kits")],
            timeout=120,
        )
        if not self.admin_kit.is_dir():
            raise DriverError(f"atoll: provision made no admin kit at {self.admin_kit}")

    def start_deployment(self) -> None:
        parents = [self.spawn([self.atoll, "server", "start", str(self.kits / "server")],
                              "server.log")]
        for site in SITES:
            parents.append(
                self.spawn([self.atoll, "site", "start", str(self.kits / site)], f"{site}.log")
            )
        # Reap each parent as soon as it exits: `atoll site|server stop` waits until the pid is
        # gone, and an unreaped child of this harness would linger as a zombie until SIGKILL.
        for proc in parents:
            threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()

    def wait_ready(self, timeout: float) -> None:
        answer = self._ctl("ready", str(len(SITES)), timeout)
        if not answer.get("ready"):
            raise DriverError(f"atoll: not ready in {timeout} s: {answer}; see {self.workdir}/*.log")

    # -- jobs --------------------------------------------------------------------------
    def prepare_job(self, model_mb: float, rounds: int, mark_dir: Path) -> Path:
        jobs = self.workdir / "jobs"
        name = f"bench-{len(list(jobs.glob('*'))) if jobs.exists() else 0}"
        res = self.run_cmd(
            [
                self.python,
                str(ATOLL_DIR / "make_job.py"),
                "--out",
                str(jobs),
                "--name",
                name,
                "--rounds",
                str(rounds),
                "--layers",
                ",".join(str(n) for n in layer_elems(model_mb)),
                "--mark-dir",
                str(mark_dir),
            ],
            timeout=300,
        )
        return Path(res.stdout.strip().splitlines()[-1])

    def _admin(self, *args: str, timeout: float = 120) -> dict | list:
        res = self.run_cmd(
            [self.atoll, *args, "--kit", str(self.admin_kit), "--format", "json"], timeout=timeout
        )
        try:
            return json.loads(res.stdout)
        except ValueError:
            raise DriverError(
                f"atoll: `atoll {' '.join(args)}` printed no JSON: {res.stdout[-500:]}"
            ) from None

    def submit(self, job: object) -> JobRun:
        t0 = time.time()
        answer = self._admin("job", "submit", str(job), timeout=600)
        job_id = answer.get("job_id") if isinstance(answer, dict) else None
        if not job_id:
            raise DriverError(f"atoll: no job_id in the submit output: {answer}")
        return JobRun(job_id=job_id, submitted_at=t0, extra={"submit_cli_s": time.time() - t0})

    def wait_finished(self, run: JobRun, timeout: float) -> None:
        answer = self._ctl("wait", run.job_id, timeout)
        if not answer.get("finished"):
            raise DriverError(f"atoll: job {run.job_id} not finished in {timeout} s: {answer}")
        run.finished_at, run.status = answer["t"], answer["status"]
        if answer.get("reason"):
            run.extra["reason"] = answer["reason"]
            if not run.status.endswith("COMPLETED"):
                self.log(f"  atoll: job {run.job_id} {run.status}: {answer['reason'][:300]}")

    def abort(self, run: JobRun) -> None:
        self._admin("job", "abort", run.job_id)

    def list_jobs(self) -> None:
        self._admin("job", "list")

    def stop_deployment(self) -> None:
        for site in SITES:
            self.run_cmd([self.atoll, "site", "stop", str(self.kits / site)], 60, check=False)
        self.run_cmd([self.atoll, "server", "stop", str(self.kits / "server")], 60, check=False)

    def is_job_process(self, cmdline: str) -> bool:
        return "-m atoll.worker" in cmdline

    # -- helpers -------------------------------------------------------------------------
    def _byte_compile(self) -> None:
        """atoll runs from an editable install (src/), the peers from wheels that pip
        byte-compiled at install. Compile src/ the same way (a no-op when up to date), or where
        PYTHONDONTWRITEBYTECODE is set every atoll process compiles atoll anew at each start."""
        if not AtollDriver._compiled:
            self.run_cmd([self.python, "-m", "compileall", "-q", str(REPO / "src")], timeout=300)
            AtollDriver._compiled = True

    def _ctl(self, verb: str, arg: str, timeout: float) -> dict:
        res = self.run_cmd(
            [self.python, str(ATOLL_DIR / "ctl.py"), str(self.admin_kit), verb, arg, str(timeout)],
            timeout=timeout + 30,
            check=False,
        )
        answer = _last_json(res.stdout)
        if not answer and res.returncode:
            answer = {"error": res.stderr[-800:]}
        return answer


class WorkerAwareTable(ProcessTable):
    """The tagged processes plus their descendants.

    atoll's process launcher gives a job worker a clean environment (a fixed list of inherited
    variables, the job's identity, its study's env), so the harness tag does not reach the
    workers; they are found as children of the tagged parents instead (/proc/PID/task/*/children),
    and measured and stopped with them."""

    def scan(self, role: str | None = None) -> list[Proc]:
        tagged = super().scan()
        seen = {p.pid for p in tagged}
        found = [p for p in tagged if role is None or p.role == role]
        queue = [p.pid for p in tagged if p.role == "deployment"]
        while queue:
            for child in _children(queue.pop()):
                if child in seen:
                    continue
                seen.add(child)
                st = _stat(child)
                if st is None or st[0] == "Z":
                    continue
                queue.append(child)
                if role in (None, "deployment"):
                    found.append(Proc(child, st[2], "deployment"))
        return found


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out
