"""The site parent: dials the server, supervises this site's job workers, relays their traffic.

It holds the site's certificate and key; its workers never do. Exit codes of `atoll site
start` (from the one table, atoll.spec.errors.EXIT_CODES): 0 stopped cleanly; 2 bad kit or
configuration; 130 interrupted.

This is where the site's services are wired: each receives, here and nowhere else, the
collaborators it uses (the Protocols beside each service name what it needs of them).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll import __version__
from atoll.base.files import private_dir
from atoll.launchers.base import JobIdentity, LaunchRequest
from atoll.parent.local_config import LocalConfig, load_local_config
from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.pki.kit import Kit
from atoll.site.connection import ServerLink
from atoll.site.privacy_ledger import SitePrivacyLedger
from atoll.site.revocation import SiteRevocations
from atoll.site.server_channel import CurrentStub, ServerChannel
from atoll.site.supervisor import SiteJob, Supervisor
from atoll.site.worker_backend import SiteWorkerBackend
from atoll.spec import worker_env
from atoll.spec.authorization import load_policy
from atoll.wire.parent_address import tell_parent

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher
    from atoll.spec.meta_plain import Meta
    from atoll.spec.study_runtime import StudyRuntime
    from atoll.spec.study_runtime_plain import PlainStudyRuntime

log = logging.getLogger("atoll.site")

# Set by deploy/slurm/atoll-site.sbatch: this parent is a Slurm job, whose allocation ends.
ALLOCATION_VAR = "ATOLL_SITE_ALLOCATION"


class SiteParent:
    def __init__(self, kit: Kit, local: LocalConfig | None = None):
        self.kit = kit
        self.name = kit.name
        self.workspace = kit.workspace
        # Its state, the jobs' run folders and their files are this site's alone, whatever the
        # umask it was started with.
        for folder in (self.workspace, self.workspace / "tmp", self.workspace / "jobs"):
            private_dir(folder)
        # Before any thread exists: the check runs in a forked child (local_config). It also
        # checks study_runtime.yaml, to fail fast; each job's admission reads that file again.
        self.local = local or load_local_config(kit.local_dir, study_runtime=True,
                                                workspace=kit.workspace)
        # local/authorization.json, checked now so that a broken one stops the parent rather
        # than every job; each launch reads it again (site/job_acceptance.py).
        self.policy = load_policy(kit.local_dir)
        # The project's revocation list as last received; the job check asks it about signers.
        self.revocations = SiteRevocations(self.workspace, kit.ca)
        self.revocations.activate()
        self.tokens = WorkerTokens()
        # Follows an edited `server:` in kit.yaml when the server moves (server_channel.py).
        self.server = ServerChannel(kit)
        self.stub = CurrentStub(self.server)
        self.link = ServerLink(self.server.channel, self.server.stub, self._hello,
                               self._on_command, self.server.address, self.server.redial)
        self.supervisor = Supervisor(kit, host=self, link=self.link, server=self.stub,
                                     tokens=self.tokens)
        self._runs_root: Path | None = None  # on first use: it needs site.yaml's model
        self._workers = None
        self._endpoint = None
        self.worker_address = ""
        self._stopped = threading.Event()
        self._serving = threading.Event()

    # -- what the supervisor uses of this parent (site/supervisor.py, LaunchHost) --------------
    @property
    def launcher(self) -> Launcher:
        return self.local.launcher

    def study_runtime(self) -> StudyRuntime | PlainStudyRuntime:
        """local/study_runtime.yaml as it is now: read once per job, at its admission. The
        same bytes the check of local/ accepted, in the common shape, come back as its plain
        values (spec/study_runtime_plain.py); any other, through the models."""
        from atoll.spec.study_runtime_plain import admitted

        plain = admitted(self.local.plain_study_runtime, self.kit.local_dir)
        if plain is not None:
            return plain
        from atoll.spec.study_runtime import load_study_runtime

        return load_study_runtime(self.kit.local_dir, self.local.launcher_name)

    def capacity(self) -> dict[str, Any]:
        return dict(self.local.capacity)

    def runs_root(self) -> Path:
        """The folder holding jobs/ (process.workdir, slurm.workspace, else the workspace):
        spec/run_folders.py's rule, which `atoll site render` shows too."""
        if self._runs_root is None:  # from the check's answer: no SiteConfig loaded for it
            self._runs_root = self.local.runs_root(self.workspace)
        return self._runs_root

    def launch_request(self, job: SiteJob, name: str, meta: Meta,
                       token: str) -> LaunchRequest:
        """The request of an admitted job: the resources it was admitted with, the
        study_runtime.yaml and study entry read then, and the secrets that entry names."""
        import dataclasses

        from atoll.launchers.process_options import ProcessSite
        from atoll.launchers.request import build_request, secret_env_values
        from atoll.spec.study_runtime_plain import PlainStudyRuntime

        # The runtime the check of local/ vouched for belongs to a confined process launcher:
        # with it, site.yaml may be asked nothing more (launch_site), and no model loads.
        site = (self.local.launch_site(meta) if isinstance(job.runtime, PlainStudyRuntime)
                else self.local.site_config)
        if not isinstance(site, ProcessSite):
            from atoll.spec.errors import SpecError
            from atoll.spec.study_runtime import RUNTIME_FILE, unconfined_issues

            # Read again at every admission, so checked again: an unconfined site maps one
            # study at most.
            if issues := unconfined_issues(self.local.site_config, job.runtime):
                raise SpecError(issues, source=f"local/{RUNTIME_FILE}")
        credentials = {worker_env.JOB_TOKEN: token, **secret_env_values(job.entry, os.environ)}
        request = build_request(
            meta=meta, identity=JobIdentity(job.job_id, name, job.study, self.name, "site"),
            site_config=site, study_runtime=job.runtime, resources=job.resources,
            workdir=job.workdir, parent_address=self.worker_address, credentials=credentials,
            parent_cert=self._endpoint.cert_pem, parent_socket=self._endpoint.socket_path)
        request = _with_privacy_policy(request, self.kit.local_dir)
        heartbeat_s, _, rejoin_s = self.local.supervision  # the worker beats; the supervisor
        beats = {worker_env.HEARTBEAT_S: f"{heartbeat_s:g}"}  # watches
        if self.rejoin_to() is not None:  # it waits that long for a restarted parent
            beats[worker_env.REJOIN_S] = f"{rejoin_s:g}"
        request = dataclasses.replace(request, worker_env={**request.worker_env, **beats})
        return _with_secagg_credential(request, self.kit, job.job_id, job.workdir / "app")

    def rejoin_to(self) -> str | None:
        """Where a worker that outlives this parent dials its successor (site/running_parts.py):
        this endpoint's address and certificate, which the next parent must have again; None
        where re-attach is off (supervision.rejoin_s 0) or its workers die with the parent
        (the process launcher)."""
        if self.local.supervision[2] <= 0 or self.launcher.name == "process":
            return None
        return _dial_identity(self.worker_address, self._endpoint.cert_pem)

    def _hello(self) -> dict[str, Any]:
        self._serving.wait()  # no job may arrive before its workers have an endpoint to dial
        return {"version": __version__, "launcher": self.local.launcher_name,
                "capacity": self.capacity(), "running_jobs": self.supervisor.running_jobs(),
                # manage_job and download_job happen at the server: it enforces them for us
                "authorization": self.policy.summary()}

    def _on_command(self, kind: str, body: dict[str, Any]) -> None:
        # The server's word: the supervisor checks every identifier (spec/names.py) before use.
        job_id = body.get("job_id")
        if kind == "dispatch":
            self.supervisor.dispatch(body)
        elif kind == "abort":
            self.supervisor.abort(job_id, str(body.get("reason", "aborted")))
        elif kind == "end":
            self.supervisor.end(job_id)
        elif kind == "forget":
            self._forget(job_id)
        elif kind == "revocations":  # handled before the commands after it: dispatches see it
            if self.revocations.on_command(body):  # a newer list: running jobs it revokes end
                self.supervisor.signers_revoked()

    def _forget(self, job_id: object) -> None:
        """The server deleted a job (`atoll job delete`): its run folder here goes too, unless
        the job still runs here (the server's word does not end a running job's folder)."""
        from atoll.launchers.request import job_run_folder
        from atoll.site.retention import remove_run_folder
        from atoll.spec.names import IdentifierError, check_job_id

        try:
            job_id = check_job_id(job_id)
        except IdentifierError as exc:
            log.warning("ignored a forget command from the server: %s", exc)
            return
        if job_id in self.supervisor.running_jobs():
            log.warning("job %s was deleted at the server but runs here: its run folder stays",
                        job_id)
            return
        folder = job_run_folder(self.local.site_config, job_id)
        if not folder.is_dir() or folder.is_symlink():
            return
        # In order with the commands after it (a resume under the same id gets a new folder):
        # moved aside now, removed in the background.
        aside = folder.with_name(f".deleted-{job_id}-{time.monotonic_ns()}")
        folder.rename(aside)
        threading.Thread(target=remove_run_folder, args=(aside, self.workspace / "apps"),
                         name="forget", daemon=True).start()
        (self.workspace / "apps" / f"{job_id}.zip").unlink(missing_ok=True)
        log.info("job %s was deleted at the server: its run folder here is removed", job_id)

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> None:
        # Workers an earlier parent of this site left (killed, or stopped at an allocation's
        # end): taken back where they still run and can reach this parent, else stopped before
        # any dispatch, so that a part sent again starts afresh under its own name.
        kept = self.supervisor.parts.kept()
        # The link dials at once: its TLS handshake overlaps local/'s check, which its hello
        # (launcher, capacity) and the worker endpoint then wait for.
        threading.Thread(target=self.link.run, name="server-link", daemon=True).start()
        endpoint = self.local.endpoint
        self._endpoint = start_worker_endpoint(
            self.tokens, SiteWorkerBackend(self.name, jobs=self.supervisor, link=self.link,
                                           server=self.stub, host=self,
                                           ledger=SitePrivacyLedger(self.name, self.workspace,
                                                                    self.kit.local_dir)),
            endpoint.host, endpoint.port,
            endpoint.dial_host, endpoint.uses_tls)
        self._workers, self.worker_address = self._endpoint.server, self._endpoint.address
        if kept:  # before the hello: it names the parts taken back as running here
            self._take_back(kept)
        self._serving.set()
        self.supervisor.watch(self.local.supervision[1], self.local.progress_s,  # stalled
                              self._stopped)  # or hung workers
        log.info("site %s started; workers dial %s", self.name, self.worker_address)
        if self.local.unconfined_warning:
            log.warning(self.local.unconfined_warning)
        self._start_retention()

    def _take_back(self, kept) -> None:
        """Re-attach each kept worker that still runs and dials this parent's endpoint as it
        is now (the same address and certificate); stop the others (site/running_parts.py)."""
        to_stop = []
        here = self.rejoin_to()
        for handle, rejoin in kept:
            # through a socket in its run folder (Docker without a network); else told this
            # parent's address in its run folder (a worker that sees it: Docker, Slurm); else
            # (a Pod's own folder) only at the same address and certificate
            reaches = here is not None and rejoin is not None and (
                bool(handle.extra.get("relay")) or self.launcher.name in RUN_FOLDER_SEEN
                or rejoin.address == here)
            try:
                ok = (reaches and handle.backend == self.launcher.name
                      and self.launcher.reattach(handle, self.worker_address,
                                                 self._endpoint.socket_path)
                      and self.supervisor.adopt(handle, rejoin))
                if ok and not handle.extra.get("relay"):
                    self._tell_worker(handle.job_id)
            except Exception:  # noqa: BLE001 - it is stopped instead
                log.exception("job %s: its worker could not be taken back", handle.job_id)
                ok = False
            if not ok:
                if rejoin is not None and here is not None and not reaches:
                    log.warning("job %s: its worker dials %s, not this parent's endpoint: it "
                                "is stopped (a fixed worker_endpoint port lets it re-attach)",
                                handle.job_id, rejoin.address.split("#")[0])
                to_stop.append(handle)
        if to_stop:
            self.supervisor.parts.stop(self.launcher, to_stop)

    def _tell_worker(self, job_id: str) -> None:
        job = self.supervisor.job(job_id)
        try:  # a worker at the same address comes back without it
            tell_parent(job.workdir, self.worker_address, self._endpoint.cert_pem)
        except OSError as exc:
            log.warning("job %s: its worker was not told this parent's address: %s", job_id,
                        exc)

    def _start_retention(self) -> None:
        days = self.local.retention_days
        if days is None:  # the default keeps every run folder: nothing to load or start
            return
        from atoll.site.retention import start_sweeper
        from atoll.spec.run_folders import JOBS

        start_sweeper(self.runs_root() / JOBS, self.workspace / "apps", days,
                      self.supervisor.running_jobs, self._stopped)

    def stop(self, leave_workers: bool = False) -> None:
        """Stop; with leave_workers (a Slurm allocation's end, with re-attach on), the workers
        of containers, pods and Slurm jobs run on and wait for this site's next parent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if leave_workers and self.rejoin_to() is not None:
            self.supervisor.leaving = True
            log.warning("the site parent stops; its workers wait %g s for the next one "
                        "(supervision.rejoin_s)", self.local.supervision[2])
        else:
            self.supervisor.stop_all()
        self.link.stop()
        if self._workers is not None:
            self._endpoint.stop(0.2)
        self.local.close()
        self.server.close()


RUN_FOLDER_SEEN = frozenset({"docker", "slurm"})  # their workers see the job's run folder


def _dial_identity(address: str, cert_pem: str | None) -> str:
    """The endpoint as a worker pins it: its address, and its certificate's digest with TLS."""
    if not cert_pem:
        return address
    import hashlib

    return f"{address}#{hashlib.sha256(cert_pem.encode()).hexdigest()[:32]}"


def run_forever(kit: Kit, ready_file: Path | None = None,
                local: LocalConfig | None = None) -> int:
    import signal

    from atoll.base.malloc_tuning import tune_for_streaming

    tune_for_streaming()

    site = SiteParent(kit, local)
    site.start()
    if ready_file is not None:
        ready_file.write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
    done = threading.Event()
    got: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _: (got.append(number), done.set()))
    # A signal can land on any of gRPC's threads; Python runs its handler only when the main
    # thread next wakes up, so wake up now and then (an untimed wait missed SIGTERMs).
    while not done.wait(0.5):
        pass
    # A parent that is a Slurm job (deploy/slurm/atoll-site.sbatch) is sent SIGTERM as its
    # allocation ends: its successor, queued already, takes its workers back.
    site.stop(leave_workers=bool(os.environ.get(ALLOCATION_VAR))
              and got[:1] == [signal.SIGTERM])
    return 0


def _with_secagg_credential(request: LaunchRequest, kit: Kit, job_id: str,
                            app_dir: Path) -> LaunchRequest:
    """A job with secure aggregation: a fresh key for its worker, certified with this site's
    key in a process of its own (pki/worker_credential.py), so that the other sites can tell
    this site's messages from the server's; a secret, through the launcher's secret channel."""
    import dataclasses

    if not _asks_secure_aggregation(app_dir):
        return request
    from atoll.pki.worker_credential import CREDENTIAL_VAR, issue_apart

    secret = issue_apart(kit.key, kit.cert, kit.ca, job_id)
    return dataclasses.replace(request, credentials={**request.credentials,
                                                     CREDENTIAL_VAR: secret})


def _asks_secure_aggregation(app_dir: Path) -> bool:
    """Whether the app's app.yaml asks for secure aggregation. An app.yaml without a
    ``privacy`` section asks for nothing, and spec/privacy.py (its models) stays unloaded; any
    other, or one that cannot be read, goes to that module, which reads it or says why not."""
    import yaml

    try:
        data = yaml.safe_load((app_dir / "app.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        data = {"privacy": "unread"}  # read_app_privacy below raises what is wrong
    if not (data.get("privacy") if isinstance(data, dict) else None):
        return False  # as read_app_privacy: a missing or empty section is every default
    from atoll.spec.privacy import read_app_privacy

    return read_app_privacy(app_dir).secure_aggregation is not None


def _with_privacy_policy(request: LaunchRequest, local_dir: Path) -> LaunchRequest:
    """The site's privacy policy (local/privacy.yaml) for its worker to apply: not a secret,
    and the worker checks the job against it again before the job's script runs."""
    import dataclasses

    from atoll.site.job_acceptance import has_privacy_policy

    if not has_privacy_policy(local_dir):
        return request
    from atoll.spec.privacy import load_site_policy
    from atoll.spec.worker_env import PRIVACY_POLICY as POLICY_ENV

    policy = load_site_policy(local_dir)
    if policy is None:
        return request
    return dataclasses.replace(request, worker_env={**request.worker_env,
                                                    POLICY_ENV: policy.model_dump_json()})
