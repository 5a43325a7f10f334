"""The life of a job on the server: dispatch, the server worker, the parts' states, the end.

What comes before is server/intake.py's (a job taken in, checked, queued) and the scheduler's
(when it can run); the apps' zips the participants fetch are server/app_zips.py's.

A job is SUBMITTED until the scheduler dispatches it, then each participant (the server and
every site) moves through DISPATCHED -> STARTING -> RUNNING -> FINISHED:<outcome> with a reason.
The job ends when the server's part and every site's part have ended: COMPLETED when the
workflow completed (sites it tolerated losing are named in the reason), otherwise FAILED or
ABORTED with the reason that decided it.

A job signed by a user whose certificate is revoked never starts, whatever its state says:
the signer is checked (server/job_signer.py) when a newer revocation list arrives (waiting
jobs are cancelled, running ones aborted: `signers_revoked`), at dispatch, and just before the
server worker is launched.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.launchers.base import Handle, LaunchError, Outcome, WorkerExit
from atoll.launchers.job_files import create_job_file
from atoll.pki.files import private_dir
from atoll.pki.job_signature import SIGNATURE_FILE
from atoll.server.app_zips import AppZips
from atoll.server.intake import Intake, IntakeLimits, JobQueue
from atoll.server.job_signer import revoked_signer
from atoll.server.relay import JobRelay
from atoll.server.site_links import ControlTooLarge
from atoll.server.spool import Budget
from atoll.server.store import JobRecord
from atoll.spec.errors import SpecError
from atoll.wire.reasons import clip, public

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher, LaunchRequest
    from atoll.parent.worker_endpoint import WorkerTokens
    from atoll.pki.identity import Identity
    from atoll.pki.revocation import RevocationList
    from atoll.server.job_signing import SubmissionCheck
    from atoll.server.provenance import ServerProvenance
    from atoll.server.site_links import SiteLink
    from atoll.server.store import Store
    from atoll.server.studies import StudySites
    from atoll.spec.meta import JobMeta
    from atoll.spec.resources import Resources

log = logging.getLogger("atoll.server.jobs")

END_GRACE_S = 60.0  # how long sites get to wrap up after the workflow completed
FAILED_GRACE_S = 5.0  # ... and after it failed: to report their own reason
# Payload bytes the relays of all jobs keep in memory; the rest spills to the jobs' folders.
RELAY_MEMORY = 4 * 1024 * 1024


@dataclass
class LiveJob:
    record: JobRecord
    meta: JobMeta  # validated at intake; it went with the job to the scheduler and here
    sites: list[str]
    relay: JobRelay
    folder: Path
    handle: Handle | None = None
    report: tuple[bool, str] | None = None  # the server worker's own Finish report
    server_state: str | None = None
    server_reason: str = ""
    aborting: str | None = None
    site_states: dict[str, tuple[str, str]] = field(default_factory=dict)
    resources: dict[str, Resources] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.members = frozenset(self.sites)  # `site in live.sites` on every relay call

    @property
    def id(self) -> str:
        return self.record.id


class SiteCommands(Protocol):
    """The connected sites (server/site_links.py): their control streams (send: False if the
    site is offline) and the capacity each reported."""

    def send(self, site: str, kind: str, body: dict[str, Any]) -> bool: ...

    def online(self) -> dict[str, SiteLink]: ...


class WorkerHost(Protocol):
    """Where the server worker runs: the server parent's launcher, and the request that starts
    a worker on it (server/app.py)."""

    @property
    def launcher(self) -> Launcher: ...

    def launch_request(self, record: JobRecord, meta: JobMeta, run_dir: Path, token: str,
                       shared: tuple[Path, ...] = ()) -> LaunchRequest: ...


class HeldRevocations(Protocol):
    """The revocation list the server holds now (server/revocation.py)."""

    @property
    def current(self) -> RevocationList: ...


class JobManager:
    def __init__(self, *, store: Store, studies: StudySites, links: SiteCommands,
                 queue: JobQueue, host: WorkerHost, tokens: WorkerTokens,
                 check: SubmissionCheck, limits: IntakeLimits, workspace: Path,
                 revocations: HeldRevocations, provenance: ServerProvenance | None = None):
        self.store = store
        self.studies = studies
        self.links = links
        self.queue = queue
        self.host = host
        self.tokens = tokens
        self.check = check  # a submission's signature and signer
        self.limits = limits
        self.workspace = workspace
        self.revocations = revocations
        self.provenance = provenance  # each job's signed record (server/provenance.py)
        self.jobs_dir: Path = workspace / "jobs"
        private_dir(self.jobs_dir)
        self.live: dict[str, LiveJob] = {}
        self._lock = threading.RLock()
        self.relay_budget = Budget(RELAY_MEMORY)
        self.intake = Intake(store=store, studies=studies, links=links, queue=queue,
                             check=check, limits=limits, workspace=workspace,
                             jobs_dir=self.jobs_dir, provenance=provenance)
        self.app_zips = AppZips(self.jobs_dir)

    # -- intake and the apps' zips (server/intake.py, server/app_zips.py) ----------------------
    def submit(self, who: Identity, study: str, chunks: Iterator[bytes]) -> JobRecord:
        return self.intake.submit(who, study, chunks)

    def app_zip(self, job_id: str, target: str) -> Path:
        live = self.live.get(job_id)
        return self.app_zips.get(job_id, target, live.meta if live is not None else None)

    # -- dispatch -----------------------------------------------------------------------------
    def held(self) -> dict[str, list[Resources]]:
        """What the running jobs hold at each site, until that site's part has ended."""
        used: dict[str, list[Resources]] = {}
        for live in list(self.live.values()):
            for site, res in live.resources.items():
                if site not in live.site_states:
                    used.setdefault(site, []).append(res)
        return used

    def running_at(self, job_id: str, site: str) -> LiveJob | None:
        """The job, if it runs now and ``site`` takes part in it."""
        live = self.live.get(job_id)
        return live if live is not None and site in live.members else None

    def dispatch(self, record: JobRecord, meta: JobMeta, sites: list[str],
                 skipped: dict[str, str], resources: dict[str, Resources]) -> None:
        folder = self.jobs_dir / record.id
        with self._lock:  # checked and made live at once: `signers_revoked` sees one or other
            why = revoked_signer(folder / "job", self.revocations.current)
            if why is not None:
                log.warning("job %s not dispatched: %s", record.id, why)
                self._cancel(record.id, f"cancelled: {why}")
                return
            relay = JobRelay(record.id, folder / "relay", sites, self.relay_budget,
                             handoff=self.host.launcher.shares_host)
            live = LiveJob(record, meta, sites, relay, folder, resources=resources)
            self.live[record.id] = live
        record.state = "DISPATCHED"
        self.store.set_job_state(record.id, "DISPATCHED")
        for site, reason in skipped.items():
            self.store.set_part_state(record.id, site, "FINISHED:FAILED", reason)
        body = {"job_id": record.id, "name": record.name, "study": record.study,
                "meta": record.meta}
        for site in sites:
            self.store.set_part_state(record.id, site, "DISPATCHED")
            try:
                self.links.send(site, "dispatch", body)
            except ControlTooLarge as exc:  # intake bounds the meta: only a bug gets here
                self.site_state(site, {"job_id": record.id, "state": "FINISHED:FAILED",
                                       "reason": f"the job could not be sent to {site}: {exc}"})
        threading.Thread(target=self._run_server_worker, args=(live,),
                         name=f"server-worker-{record.id[:8]}", daemon=True).start()

    def _run_server_worker(self, live: LiveJob) -> None:
        import shutil  # with the first job, not at rest: it loads bz2 and lzma

        run_dir = live.folder / "run" / "server"
        try:
            app = live.meta.app_for("server")
            shutil.copytree(live.folder / "job" / app, private_dir(run_dir) / "app",
                            dirs_exist_ok=True)
            signed = private_dir(run_dir / "signed")  # the worker checks them again
            for name in ("meta.json", SIGNATURE_FILE):
                if (live.folder / "job" / name).is_file():
                    shutil.copyfile(live.folder / "job" / name, signed / name)
            token = self.tokens.issue(live.id)
            shared = (live.relay.handoff.path,) if live.relay.handoff is not None else ()
            request = self.host.launch_request(live.record, live.meta, run_dir, token, shared)
            # the list held now, not the one at intake or dispatch (server/job_signer.py)
            why = revoked_signer(live.folder / "job", self.revocations.current)
            if why is not None:
                log.warning("job %s: its server worker is not started: %s", live.id, why)
                self.abort(live.id, f"aborted before the server worker started: {why}")
                self._server_ended(live, WorkerExit(Outcome.FAILED, why))
                return
            if live.aborting:  # aborted (a newer list, an admin) while it was being prepared
                self._server_ended(live, WorkerExit(Outcome.FAILED, live.aborting))
                return
            self.store.set_part_state(live.id, "server", "STARTING")
            live.handle = self.host.launcher.launch(request)
        except (LaunchError, SpecError, OSError) as exc:
            self._server_ended(live, WorkerExit(Outcome.FAILED, self._public(
                live, f"server worker could not start: {exc}")))
            return
        if live.aborting:  # aborted while starting
            self.host.launcher.cancel(live.handle)
        self._server_ended(live, self.host.launcher.wait(live.handle))

    def _server_ended(self, live: LiveJob, exit: WorkerExit) -> None:
        if live.aborting:
            state, reason = "ABORTED", live.aborting
        elif exit.outcome is Outcome.COMPLETED and live.report and live.report[0]:
            state, reason = "COMPLETED", ""
        else:
            state = "FAILED"
            reason = (live.report[1] if live.report and live.report[1] else exit.reason)
        reason = self._public(live, reason)
        live.server_state, live.server_reason = state, reason
        self.store.set_part_state(live.id, "server", f"FINISHED:{state}", reason)
        live.relay.end()
        # After a failure, sites are aborted only after a short grace: one about to fail on
        # its own reports its own reason, not a copy of the server's.
        for site in self._unfinished_sites(live):
            if state == "ABORTED":
                self.links.send(site, "abort", {"job_id": live.id, "reason": reason})
            elif state == "COMPLETED":
                self.links.send(site, "end", {"job_id": live.id})
        if state != "ABORTED" and self._unfinished_sites(live):
            grace = END_GRACE_S if state == "COMPLETED" else FAILED_GRACE_S
            why = (f"did not finish within {grace:.0f} s of the workflow's end"
                   if state == "COMPLETED" else "stopped: the job failed on the server")
            timer = threading.Timer(grace, self._end_stragglers, args=(live, why))
            timer.daemon = True
            timer.start()
        self._maybe_finish(live)

    def _public(self, live: LiveJob, reason: str) -> str:
        """A reason as users see it: paths relative to the job, none of the server's own."""
        run = live.folder / "run" / "server"
        return public(reason, [run, live.folder / "job", live.folder], self.workspace)

    def _end_stragglers(self, live: LiveJob, reason: str) -> None:
        for site in self._unfinished_sites(live):
            self.links.send(site, "abort", {"job_id": live.id, "reason": reason})

    # -- reports from sites -------------------------------------------------------------------
    def site_state(self, site: str, body: dict[str, Any]) -> None:
        job_id, state = str(body.get("job_id")), str(body.get("state"))
        reason = clip(str(body.get("reason", "")))  # a careless site's reason stays bounded
        live = self.live.get(job_id)
        if live is None or site not in live.members or site in live.site_states:
            return
        if state == "PROVENANCE":  # the site's signed entries, not a state of its part
            if self.provenance is not None:
                self.provenance.site_items(job_id, site, body)
            return
        if body.get("log_tail"):
            self._keep_tail(live, site, str(body["log_tail"]))
        self.store.set_part_state(job_id, site, state, reason)
        if state == "RUNNING" and live.record.state == "DISPATCHED":
            live.record.state = "RUNNING"
            self.store.set_job_state(job_id, "RUNNING")
        if state.startswith("FINISHED:"):
            live.site_states[site] = (state, reason)
            if state != "FINISHED:COMPLETED" or not live.relay.ended:
                # its reason is its own part's; the workflow's names the site and its state
                live.relay.drop_site(site, f"{site} dropped out ({state.removeprefix('FINISHED:')})")
            self._maybe_finish(live)

    @staticmethod
    def _keep_tail(live: LiveJob, site: str, tail: str) -> None:
        """A site's log tail, 0600 in the job's folder; never written through a link there."""
        private_dir(live.folder / "logs")
        try:
            with create_job_file(live.folder, f"logs/{site}.log") as out:
                out.write(tail.encode("utf-8", "replace"))
        except OSError as exc:
            log.warning("job %s: the log tail of %s was not kept: %s", live.id, site, exc)

    def site_offline(self, site: str) -> None:
        for live in list(self.live.values()):
            if site in live.members and site not in live.site_states:
                self.site_state(site, {"job_id": live.id, "state": "FINISHED:FAILED",
                                       "reason": "site parent disconnected"})

    def _unfinished_sites(self, live: LiveJob) -> list[str]:
        return [s for s in live.sites if s not in live.site_states]

    def _maybe_finish(self, live: LiveJob) -> None:
        with self._lock:
            if live.server_state is None or self._unfinished_sites(live):
                return
            if self.live.pop(live.id, None) is None:
                return
        failed = [f"{s}: {r or st}" for s, (st, r) in live.site_states.items()
                  if st != "FINISHED:COMPLETED"]
        reason = live.server_reason
        if live.server_state == "COMPLETED" and failed:
            reason = "sites that dropped out: " + "; ".join(failed)
        if self.provenance is not None:  # before the state: a download then has job.final
            self.provenance.finished(live.id, live.server_state, reason)
        self.store.set_job_state(live.id, f"FINISHED:{live.server_state}", reason)
        self.tokens.revoke(live.id)
        live.relay.close()
        import shutil

        shutil.rmtree(live.relay.folder, ignore_errors=True)
        self.queue.wake()  # what the job held at its sites is free
        log.info("job %s finished: %s %s", live.id, live.server_state, reason)

    # -- abort ----------------------------------------------------------------------------------
    def _cancel(self, job_id: str, reason: str) -> None:
        """A job that never left the queue ends ABORTED, each of its parts with the reason."""
        record = self.store.get_job(job_id)
        if record is not None and record.state == "SUBMITTED":
            for part in record.parts:
                self.store.set_part_state(job_id, part, "FINISHED:ABORTED", reason)
            self.store.set_job_state(job_id, "FINISHED:ABORTED", reason)

    def abort(self, job_id: str, reason: str) -> None:
        with self._lock:
            live = self.live.get(job_id)
            if live is None:
                self._cancel(job_id, reason)
                return
        if live.aborting:
            return
        live.aborting = reason
        live.relay.end()
        for site in self._unfinished_sites(live):
            if not self.links.send(site, "abort", {"job_id": job_id, "reason": reason}):
                self.site_state(site, {"job_id": job_id, "state": "FINISHED:ABORTED",
                                       "reason": f"{reason} (site offline)"})
        if live.handle is not None:  # in the background: the admin's call returns at once
            threading.Thread(target=self.host.launcher.cancel, args=(live.handle,),
                             name=f"cancel-{job_id[:8]}", daemon=True).start()

    def signers_revoked(self, held: RevocationList) -> list[str]:
        """A newer revocation list is in force: cancel every waiting job and abort every
        running one whose signer it revokes, each with the reason; the ids of those jobs."""
        ended = []
        with self._lock:  # no dispatch between the two lists (see `dispatch`)
            for record in self.store.list_jobs(states=["SUBMITTED"]):
                why = revoked_signer(self.jobs_dir / record.id / "job", held)
                if why is not None:
                    self._cancel(record.id, f"cancelled: {why}")
                    ended.append(record.id)
            running = list(self.live.values())
        for live in running:
            why = revoked_signer(live.folder / "job", held)
            if why is not None:
                self.abort(live.id, f"aborted: {why}")
                ended.append(live.id)
        for job_id in ended:
            log.warning("job %s ended: its submitter's certificate is revoked", job_id)
        return ended

    def recover(self) -> None:
        """After a restart: jobs that were running lost their server worker with the parent."""
        for record in self.store.list_jobs(states=["DISPATCHED", "RUNNING"]):
            reason = "the server restarted while the job ran; resubmit it"
            for part, info in record.parts.items():
                if not info["state"].startswith("FINISHED"):
                    self.store.set_part_state(record.id, part, "FINISHED:FAILED", reason)
            self.store.set_job_state(record.id, "FINISHED:FAILED", reason)

    def stop_all(self) -> None:
        for live in list(self.live.values()):
            if live.handle is not None:
                self.host.launcher.cancel(live.handle)


def job_summary(record: JobRecord) -> dict[str, Any]:
    out = record.summary()
    out["deploy_map"] = record.meta.get("deploy_map")
    return json.loads(json.dumps(out))

