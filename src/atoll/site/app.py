"""The site parent: dials the server, supervises this site's job workers, relays their traffic.

It holds the site's certificate and key; its workers never do. Exit codes of `atoll site
start`: 0 stopped cleanly; 2 bad kit or configuration.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from atoll import __version__
from atoll.launchers.base import JobIdentity, LaunchRequest
from atoll.launchers.registry import get_launcher
from atoll.launchers.request import build_request, secret_env_values
from atoll.pki.kit import Kit
from atoll.pki.tls import channel_credentials
from atoll.site.connection import ServerLink
from atoll.site.supervisor import Supervisor
from atoll.site.worker_backend import SiteWorkerBackend
from atoll.spec.site_config import load_site_config
from atoll.spec.study_runtime import load_study_runtime
from atoll.wire import atoll_pb2_grpc as pb_grpc
from atoll.wire.grpc_setup import secure_channel
from atoll.wire.worker_endpoint import WorkerTokens, start_worker_endpoint

log = logging.getLogger("atoll.site")


class SiteParent:
    def __init__(self, kit: Kit):
        self.kit = kit
        self.name = kit.name
        self.workspace = kit.workspace
        (self.workspace / "tmp").mkdir(parents=True, exist_ok=True)
        self.site_config = load_site_config(kit.local_dir / "site.yaml")
        load_study_runtime(kit.local_dir, self.site_config.launcher)  # fail fast at start
        self.launcher = get_launcher(self.site_config.launcher, self.site_config)
        self.tokens = WorkerTokens()
        self.channel = secure_channel(kit.server_address, channel_credentials(kit), None)
        self.stub = pb_grpc.FederationStub(self.channel)
        self.supervisor = Supervisor(self)
        self.link = ServerLink(self.channel, self.stub, self._hello, self._on_command,
                               kit.server_address)
        self._workers = None
        self._endpoint = None
        self.worker_address = ""
        self._stopped = threading.Event()

    # -- configuration, re-read at every launch --------------------------------------------------
    def study_entry(self, study: str):
        return load_study_runtime(self.kit.local_dir, self.site_config.launcher).entry(study)

    def capacity(self) -> dict[str, Any]:
        cap = self.site_config.capacity
        return {"gpus": cap.gpus, "cpus": cap.cpus, "memory": cap.memory}

    def launch_request(self, body: dict[str, Any], meta, workdir: Path,
                       token: str) -> LaunchRequest:
        study = str(body["study"])
        runtime = load_study_runtime(self.kit.local_dir, self.site_config.launcher)
        credentials = {"ATOLL_JOB_TOKEN": token,
                       **secret_env_values(runtime.entry(study), os.environ)}
        return build_request(
            meta=meta,
            identity=JobIdentity(str(body["job_id"]), str(body.get("name", "")), study,
                                 self.name, "site"),
            site_config=self.site_config, study_runtime=runtime, workdir=workdir,
            parent_address=self.worker_address, credentials=credentials,
            parent_cert=self._endpoint.cert_pem)

    def _hello(self) -> dict[str, Any]:
        return {"version": __version__, "launcher": self.site_config.launcher,
                "capacity": self.capacity(), "running_jobs": self.supervisor.running_jobs()}

    def _on_command(self, kind: str, body: dict[str, Any]) -> None:
        job_id = str(body.get("job_id", ""))
        if kind == "dispatch":
            self.supervisor.dispatch(body)
        elif kind == "abort":
            self.supervisor.abort(job_id, str(body.get("reason", "aborted")))
        elif kind == "end":
            self.supervisor.end(job_id)

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> None:
        endpoint = self.site_config.worker_endpoint
        self._endpoint = start_worker_endpoint(
            self.tokens, SiteWorkerBackend(self), endpoint.host, endpoint.port,
            endpoint.dial_host, endpoint.uses_tls)
        self._workers, self.worker_address = self._endpoint.server, self._endpoint.address
        threading.Thread(target=self.link.run, name="server-link", daemon=True).start()
        log.info("site %s started; workers dial %s", self.name, self.worker_address)

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.supervisor.stop_all()
        self.link.stop()
        if self._workers is not None:
            self._workers.stop(0.2).wait(1)
        self.launcher.close()
        self.channel.close()


def run_forever(kit: Kit, ready_file: Path | None = None) -> int:
    import signal

    from atoll.memory import tune_for_streaming

    tune_for_streaming()

    parent = SiteParent(kit)
    parent.start()
    if ready_file is not None:
        ready_file.write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    parent.stop()
    return 0
