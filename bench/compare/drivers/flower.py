"""Flower 1.42 in deployment mode: `flower-superlink` and two `flower-supernode` processes.

The SuperLink serves its Fleet, Control and Runtime APIs over HTTPS with a certificate from a
throw-away CA made here with openssl; SuperNodes verify it. Flower has no mutual TLS: its
client authentication is a separate key scheme (`--enable-supernode-auth`), not enabled here,
so this peer runs with server-authenticated TLS only. Runtime dependency installation (`uv
sync`) is disabled: the job's dependencies are already in the venv, and nothing may leave
the machine. Jobs go through `flwr run` / `flwr ls` / `flwr stop` as a user types them;
readiness and completion are watched by flower/ctl.py over Flower's Control API.
"""

from __future__ import annotations

import os
import signal
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
from drivers.flare import _last_json

FLOWER_DIR = COMPARE_DIR / "flower"
APP_DIR = FLOWER_DIR / "app"

CONFIG_TOML = """\
[superlink]
default = "bench"

[superlink.bench]
address = "127.0.0.1:{port}"
root-certificates = "{ca}"
"""


class FlowerDriver(Driver):
    name = "flower"
    title = "Flower 1.42"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.venv = VENVS / "flower"
        self.bin = self.venv / "bin"
        self.port = 0

    def missing(self) -> str | None:
        if not (self.bin / "flower-superlink").exists():
            return f"{self.venv} has no flwr: run bench/compare/setup_peers.sh flower"
        return None

    def system_env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:{os.environ.get('PATH', '')}",
            "HOME": str(self.workdir / "home"),
            "FLWR_HOME": str(self.workdir / "flwr"),
        }

    # -- deployment --------------------------------------------------------------------
    def prepare(self) -> None:
        for sub in ("home", "flwr", "certs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self._make_certs(self.workdir / "certs")
        self.port = free_port_block(3, start=29000)
        (self.workdir / "flwr" / "config.toml").write_text(
            CONFIG_TOML.format(port=self.port, ca=self.workdir / "certs" / "ca.crt")
        )

    def _make_certs(self, d: Path) -> None:
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self.run_cmd(
            [
                "openssl",
                "req",
                "-x509",
                *ec,
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "7",
                "-subj",
                "/CN=bench-compare-ca",
            ],
            timeout=60,
            cwd=d,
        )
        self.run_cmd(
            [
                "openssl",
                "req",
                *ec,
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
            timeout=60,
            cwd=d,
        )
        (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        self.run_cmd(
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "7",
                "-extfile",
                "san.cnf",
            ],
            timeout=60,
            cwd=d,
        )

    def start_deployment(self) -> None:
        certs = self.workdir / "certs"
        self.spawn(
            [
                str(self.bin / "flower-superlink"),
                "--ssl-ca-certfile",
                str(certs / "ca.crt"),
                "--ssl-certfile",
                str(certs / "server.crt"),
                "--ssl-keyfile",
                str(certs / "server.key"),
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            "superlink.log",
        )
        for i in (1, 2):
            self.spawn(
                [
                    str(self.bin / "flower-supernode"),
                    "--root-certificates",
                    str(certs / "ca.crt"),
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port + i),
                    "--node-config",
                    f"partition-id={i - 1} num-partitions=2",
                ],
                f"supernode-{i}.log",
            )

    def watcher_argv(self, verb: str) -> list[str]:
        return [str(self.bin / "python"), str(FLOWER_DIR / "ctl.py"), verb]

    # -- jobs ----------------------------------------------------------------------------
    def prepare_job(
        self, model_mb: float, rounds: int, mark_dir: Path, shape: str = "flat"
    ) -> list[str]:
        layers = ",".join(str(n) for n in layer_counts(model_mb, shape))  # float32: no bf16
        return [f"num-server-rounds={rounds}", f'layers="{layers}"', f'mark-dir="{mark_dir}"']

    def submit(self, job: object) -> JobRun:
        argv = [str(self.bin / "flwr"), "run", str(APP_DIR), "bench", "--format", "json"]
        for item in job:  # type: ignore[attr-defined]
            argv += ["--run-config", item]
        watcher = self.watcher("wait")
        t0 = time.time()
        try:
            res = self.run_cmd(argv, timeout=300)
            answer = _last_json(res.stdout)
            if not answer.get("success") or "run-id" not in answer:
                raise DriverError(f"flower: `flwr run` gave no run id: {res.stdout[-500:]}")
        except BaseException:
            watcher.drop()
            raise
        return JobRun(job_id=str(answer["run-id"]), submitted_at=t0,
                      extra={"submit_cli_s": time.time() - t0, "watcher": watcher})

    def wait_finished(self, run: JobRun, timeout: float) -> None:
        answer = run.extra.pop("watcher").go(run.job_id, timeout)
        if not answer.get("finished"):
            raise DriverError(
                f"flower: run {run.job_id} not finished in {timeout} s: "
                f"{answer}"
            )
        run.finished_at, run.status = answer["t"], answer["status"]

    def abort(self, run: JobRun) -> None:
        self.run_cmd([str(self.bin / "flwr"), "stop", run.job_id, "bench"], timeout=120)

    def list_jobs(self) -> None:
        self.run_cmd([str(self.bin / "flwr"), "ls", "bench"], timeout=120)

    def stop_deployment(self) -> None:
        # Flower has no stop command for a deployment: one stops each process with Ctrl-C,
        # which signals its whole process group (the SuperExec it started included).
        for proc in self._children:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def is_job_process(self, cmdline: str) -> bool:
        return "flwr-serverapp" in cmdline or "flwr-clientapp" in cmdline
