"""NVIDIA FLARE 2.9 in POC mode: server and two clients as separate processes, mutual TLS.

Uses FLARE's own tools only: `nvflare poc prepare/start/stop` for the deployment, the
`nvflare job submit|list|abort` CLI as a user runs it, FLARE's FedAvg recipe with a numpy
client script (bench/compare/flare/), and FLARE's Session API to watch readiness and job
status without a new process per poll. HOME and NVFLARE_POC_WORKSPACE point into the run's
work folder so nothing touches the user's ~/.nvflare.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from drivers.base import (
    COMPARE_DIR,
    VENVS,
    Driver,
    DriverError,
    JobRun,
    free_port_block,
    layer_counts,
)

FLARE_DIR = COMPARE_DIR / "flare"
ADMIN = "admin@nvidia.com"

PROJECT_YML = """\
api_version: 3
name: example_project
description: atoll bench/compare POC project (FLARE's POC defaults, own port)
participants:
  - {{name: server, type: server, org: nvidia, fed_learn_port: {port}, default_host: localhost}}
  - {{name: {admin}, type: admin, org: nvidia, role: project_admin}}
  - {{name: site-1, type: client, org: nvidia}}
  - {{name: site-2, type: client, org: nvidia}}
builders:
  - path: nvflare.lighter.impl.workspace.WorkspaceBuilder
    args: {{template_file: [master_template.yml]}}
  - path: nvflare.lighter.impl.static_file.StaticFileBuilder
    args: {{config_folder: config}}
  - path: nvflare.lighter.impl.cert.CertBuilder
  - path: nvflare.lighter.impl.signature.SignatureBuilder
"""


class FlareDriver(Driver):
    name = "flare"
    title = "NVIDIA FLARE 2.9"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.venv = VENVS / "flare"
        self.python = str(self.venv / "bin" / "python")
        self.nvflare = str(self.venv / "bin" / "nvflare")
        self.port = 0

    @property
    def kit(self) -> Path:
        return self.workdir / "poc" / "example_project" / "prod_00" / ADMIN

    def missing(self) -> str | None:
        if not (self.venv / "bin" / "nvflare").exists():
            return f"{self.venv} has no nvflare: run bench/compare/setup_peers.sh flare"
        return None

    def system_env(self) -> dict[str, str]:
        import os

        return {
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
            "HOME": str(self.workdir / "home"),
            "NVFLARE_POC_WORKSPACE": str(self.workdir / "poc"),
        }

    def prepare(self) -> None:
        (self.workdir / "home").mkdir(parents=True, exist_ok=True)
        self.port = free_port_block(1, start=28000)
        project = self.workdir / "project.yml"
        project.write_text(PROJECT_YML.format(port=self.port, admin=ADMIN))
        self.run_cmd([self.nvflare, "poc", "prepare", "-i", str(project), "--force"], timeout=120)
        if not self.kit.is_dir():
            raise DriverError(f"flare: poc prepare made no admin kit at {self.kit}")

    def start_deployment(self) -> None:
        # `poc start` runs each participant's startup/start.sh, which daemonizes.
        proc = self.spawn([self.nvflare, "poc", "start", "--no-wait"], "poc_start.log")
        try:
            rc = proc.wait(timeout=120)
        except Exception:
            raise DriverError(
                "flare: `nvflare poc start --no-wait` did not return in 120 s"
            ) from None
        if rc != 0:
            raise DriverError(
                f"flare: `nvflare poc start` exited {rc}; see {self.workdir}/poc_start.log"
            )

    def watcher_argv(self, verb: str) -> list[str]:
        return [self.python, str(FLARE_DIR / "ctl.py"), str(self.kit), verb]

    def prepare_job(
        self, model_mb: float, rounds: int, mark_dir: Path, shape: str = "flat"
    ) -> Path:
        jobs = self.workdir / "jobs"
        name = f"bench-{len(list(jobs.glob('*'))) if jobs.exists() else 0}"
        # FLARE's numpy Client API has no bf16: float32 tensors of the same byte sizes
        layers = ",".join(str(n) for n in layer_counts(model_mb, shape))
        res = self.run_cmd(
            [
                self.python,
                str(FLARE_DIR / "make_job.py"),
                "--out",
                str(jobs),
                "--name",
                name,
                "--rounds",
                str(rounds),
                "--layers",
                layers,
                "--mark-dir",
                str(mark_dir),
            ],
            timeout=120,
        )
        return Path(res.stdout.strip().splitlines()[-1])

    def submit(self, job: object) -> JobRun:
        watcher = self.watcher("wait")
        t0 = time.time()
        try:
            res = self.run_cmd(
                [self.nvflare, "--format", "json", "job", "submit", "-j", str(job)], timeout=120
            )
            job_id = _find_key(_last_json(res.stdout), "job_id")
            if not job_id:
                raise DriverError(f"flare: no job_id in submit output: {res.stdout[-500:]}")
        except BaseException:
            watcher.drop()
            raise
        return JobRun(job_id=job_id, submitted_at=t0,
                      extra={"submit_cli_s": time.time() - t0, "watcher": watcher})

    def wait_finished(self, run: JobRun, timeout: float) -> None:
        answer = run.extra.pop("watcher").go(run.job_id, timeout)
        if not answer.get("finished"):
            raise DriverError(
                f"flare: job {run.job_id} not finished in {timeout} s: "
                f"{answer}"
            )
        run.finished_at, run.status = answer["t"], answer["status"]

    def abort(self, run: JobRun) -> None:
        self.run_cmd([self.nvflare, "job", "abort", run.job_id, "--force"], timeout=120)

    def list_jobs(self) -> None:
        self.run_cmd([self.nvflare, "job", "list"], timeout=120)

    def stop_deployment(self) -> None:
        self.run_cmd([self.nvflare, "poc", "stop"], timeout=120, check=False)

    def is_job_process(self, cmdline: str) -> bool:
        # server job: ...server.runner_process; client job: ...client.worker_process
        return "nvflare.private.fed.app" in cmdline and (
            "runner_process" in cmdline or "worker_process" in cmdline
        )


def _last_json(text: str) -> dict:
    """The last JSON object a tool printed (FLARE and our pollers print one envelope)."""
    text = text.strip()
    start = text.rfind("\n{")
    for candidate in (text, text[start + 1 :] if start >= 0 else ""):
        try:
            value = json.loads(candidate)
            return value if isinstance(value, dict) else {}
        except ValueError:
            continue
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
            if isinstance(value, dict):
                return value
        except ValueError:
            continue
    return {}


def _find_key(obj, key: str):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for value in obj.values():
            found = _find_key(value, key)
            if found:
                return found
    return None
