"""The server parent: one mutual-TLS port for sites and admins, the job store, the scheduler,
the relay, and the endpoint its own server workers dial.

This is where the server's services are wired: each receives, here and nowhere else, the
collaborators it uses (the Protocols beside each service name what it needs of them).

Exit codes of `atoll server start` (from the one table, atoll.spec.errors.EXIT_CODES): 0 stopped
cleanly; 2 bad kit or configuration; 3 the port could not be opened; 130 interrupted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll import __version__
from atoll.base.files import private_dir
from atoll.launchers.base import JobIdentity, LaunchRequest
from atoll.parent.local_config import LocalConfig, load_local_config
from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.pki.kit import Kit
from atoll.pki.tls import server_credentials
from atoll.server.admin_service import AdminService
from atoll.server.federation_service import TASKS_QUIET_S, FederationService
from atoll.server.heap import HeapKeeper
from atoll.server.job_signing import SubmissionCheck
from atoll.server.jobs import JobManager
from atoll.server.provenance import ServerProvenance
from atoll.server.revocation import ServerRevocations
from atoll.server.scheduler import JobQueue, Scheduler
from atoll.server.sessions import SessionSigner
from atoll.server.site_links import CONNECT_QUIET_S, SiteLinks
from atoll.server.store import JobRecord, Store, open_store
from atoll.server.studies import Studies
from atoll.server.study_ops import study_ops
from atoll.server.worker_backend import ServerWorkerBackend
from atoll.spec import worker_env

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher
    from atoll.pki.identity import Identity
    from atoll.spec.meta_plain import Meta

log = logging.getLogger("atoll.server")

# Threads for the calls served on threads (job uploads and result downloads). Everything else is
# served on the event loop; what it must not do there (SQLite) runs on its small executor.
HANDLER_THREADS = 64


@dataclass(frozen=True)
class Limits:
    max_upload_bytes: int = 1 << 30  # a job folder's zip
    max_job_bytes: int = 2 << 30  # the same, uncompressed


class ServerParent:
    def __init__(self, kit: Kit, limits: Limits | None = None, local: LocalConfig | None = None):
        self.kit = kit
        self.limits = limits or Limits()
        self.workspace = kit.workspace
        # First, while this is the only thread: the check runs in a forked child (local_config).
        self.local = local or load_local_config(kit.local_dir, study_runtime=False,
                                                workspace=kit.workspace)
        # The job store, jobs, payloads and results are the server's alone, whatever the umask.
        for folder in (self.workspace, self.workspace / "tmp"):
            private_dir(folder)
        self.store = open_store(self.workspace / "atoll.db")
        self.studies = Studies(self.store)
        seeded = self.workspace / ".seeded"
        if not seeded.exists() and kit.project_json.exists():
            self.studies.seed(json.loads(kit.project_json.read_text()))
            seeded.touch(mode=0o600)
        if self.studies.settle_default():  # a workspace from before `default` was scoped
            log.warning("the project has named studies: the jobs of study `default` are kept in "
                        "an ordinary study with no members (docs/federation.md, Studies)")
        self.signer = SessionSigner(self.workspace / "session.key")
        self.links = SiteLinks()
        # Before the first call: each one is checked against the project's revocation list.
        self.revocations = ServerRevocations(self.workspace, kit.ca, self.links, self.store)
        self.revocations.activate()
        self.tokens = WorkerTokens()
        self._stopped = threading.Event()
        # Intake hands each job's validated meta to the queue; the scheduler takes it from there
        # to dispatch, and the job keeps it while it runs.
        self.queue = JobQueue()
        self.jobs = JobManager(
            store=self.store, studies=self.studies, links=self.links, queue=self.queue,
            host=self, tokens=self.tokens, limits=self.limits, workspace=self.workspace,
            check=SubmissionCheck(kit.ca, kit.project, self.studies),
            revocations=self.revocations,
            provenance=_provenance(kit, self.workspace / "jobs"))
        self.revocations.on_change = self.jobs.signers_revoked
        self.scheduler = Scheduler(self.queue, self.store, self.studies, self.links, self.jobs)
        self._grpc = None
        self._workers = None
        self._endpoint = None
        self.port = 0
        self.worker_address = ""

    @property
    def stopping(self) -> bool:
        return self._stopped.is_set()

    # -- what the jobs use of this parent (server/jobs.py, WorkerHost) ------------------------
    @property
    def launcher(self) -> Launcher:
        return self.local.launcher

    def launch_request(self, record: JobRecord, meta: Meta, run_dir: Path,
                       token: str, shared: tuple[Path, ...] = ()) -> LaunchRequest:
        """The server worker's request, from the meta the job carries since intake. On the
        process launcher, for a meta without a launcher_spec, site.yaml is asked nothing the
        check of local/ did not already answer: no SiteConfig (no model) is loaded for it."""
        from atoll.launchers.request import build_request

        private_dir(run_dir / "logs")
        return build_request(
            meta=meta,
            identity=JobIdentity(record.id, record.name, record.study, "server", "server"),
            site_config=self.local.launch_site(meta), study_runtime=None, workdir=run_dir,
            parent_address=self.worker_address, credentials={worker_env.JOB_TOKEN: token},
            parent_cert=self._endpoint.cert_pem, check_capacity=False, shared_folders=shared,
            parent_socket=self._endpoint.socket_path)

    def start(self) -> None:
        # site.yaml's supervision.rejoin_s: how long a site's parts wait for their site parent
        self.jobs.rejoin_s = self.local.supervision[2]
        self.jobs.max_resumes = self.local.max_resumes
        self.jobs.recover()  # before sites may connect: a resumed job is live when they do
        from atoll.wire.aio_server import LoopServer
        from atoll.wire.guard import Deadlines

        server = LoopServer(HANDLER_THREADS, tls_record_bytes=self.local.tls_record_bytes)
        self._grpc = server
        # each call admitted (certificate, kind, per-peer limits) before its request is read
        federation = FederationService(
            store=self.store, jobs=self.jobs, studies=self.studies, links=self.links,
            revocations=self.revocations, wake=self.queue.wake, stopping=self._stopped.is_set)
        admin = AdminService(
            store=self.store, studies=self.studies, jobs=self.jobs, links=self.links,
            signer=self.signer, scratch=self.workspace / "tmp", stopping=self._stopped.is_set,
            ops={**_study_ops(self.studies, self.store, self.kit.ca, self.revocations),
                 **self.revocations.ops()})
        # A site's control stream is as quiet as its heartbeat period (site_links.py): its
        # liveness is the stale-link check's (four of its periods), not a 30 s read deadline;
        # a job's task stream, as quiet as its site's training between a task and its reply.
        server.serve("Federation", federation, federation.admit,
                     deadlines={"Connect": Deadlines(next_s=CONNECT_QUIET_S),
                                "Tasks": Deadlines(next_s=TASKS_QUIET_S)})
        server.serve("Admin", admin, admin.admit)
        self.port = server.add_secure_port(self.kit.listen_address, server_credentials(self.kit))
        if self.port == 0:
            raise OSError(f"cannot listen on {self.kit.listen_address}")
        server.start()
        # Sites may connect now; jobs wait for the scheduler, which needs the worker endpoint,
        # which needs local/'s check (started before this process imported gRPC).
        endpoint = self.local.endpoint
        self._endpoint = start_worker_endpoint(
            self.tokens,
            ServerWorkerBackend(self.jobs, self.store, self.kit.ca, self.jobs.provenance),
            endpoint.host, endpoint.port, endpoint.dial_host, endpoint.uses_tls)
        self._workers, self.worker_address = self._endpoint.server, self._endpoint.address
        self.jobs.launch_resumed()  # the jobs `recover` resumed: their new server workers
        self.scheduler.start()
        threading.Thread(target=self._watch_links, name="liveness", daemon=True).start()
        threading.Thread(target=HeapKeeper().run, args=(self._stopped,), name="heap",
                         daemon=True).start()
        log.info("server %s listening on %s; workers dial %s", self.kit.name,
                 self.kit.listen_address, self.worker_address)
        if self.local.unconfined_warning:
            log.warning(self.local.unconfined_warning)

    def _watch_links(self) -> None:
        while not self._stopped.wait(2.0):
            for link in self.links.stale():
                log.warning("site %s missed its heartbeats; dropping its link", link.name)
                link.close()
            for link in self.links.repace():  # the federation grew: fewer heartbeats each
                link.send("welcome", {"heartbeat_s": link.heartbeat_s})

    def stop(self, grace: float = 0.2) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.scheduler.stop()
        self.jobs.stop_all()
        if self._grpc is not None:
            self._grpc.stop(grace)
        if self._workers is not None:
            self._endpoint.stop(grace)
        self.local.close()
        self.store.close()

    def wait(self) -> None:
        while not self._stopped.wait(3600):
            pass


def _study_ops(studies: Studies, store: Store, ca: Path,
               revocations: ServerRevocations) -> dict[str, Any]:
    """The admin operations on studies (server/study_ops.py)."""
    def certified(pem: bytes) -> Identity:
        from atoll.pki.identity import issued_identity

        identity = issued_identity(pem, ca.read_bytes())
        why = revocations.refusal(pem)
        if why is not None:
            raise ValueError(why)
        return identity

    return study_ops(studies, store, certified)


def run_forever(kit: Kit, ready_file: Path | None = None,
                local: LocalConfig | None = None) -> int:
    import signal

    from atoll.base.malloc_tuning import tune_for_streaming

    tune_for_streaming()

    server = ServerParent(kit, local=local)
    server.start()
    if ready_file is not None:
        ready_file.write_text(json.dumps({"pid": os.getpid(), "port": server.port,
                                          "at": time.time()}))
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    # A signal can land on any of gRPC's threads; Python runs its handler only when the main
    # thread next wakes up, so wake up now and then (an untimed wait missed SIGTERMs).
    while not done.wait(0.5):
        pass
    server.stop()
    return 0


def _provenance(kit: Kit, jobs_dir: Path) -> ServerProvenance | None:
    from atoll.pki.provenance import BENCHMARK_OFF, switched_off

    if switched_off():
        log.warning("%s=1: this server keeps no provenance records (for benchmarks only)",
                    BENCHMARK_OFF)
        return None
    return ServerProvenance(kit, jobs_dir, __version__)
