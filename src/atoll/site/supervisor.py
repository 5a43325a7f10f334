"""The site's supervisor of job workers: check each job again, launch, watch, report, cancel.

The site trusts nothing the server sends: it re-validates the job's meta, requires that its own
study_runtime.yaml maps the job's study, and admits the job against its own capacity; then it
verifies the submitter's signature of what it fetched and applies its own authorization policy
(site/job_acceptance.py) before a worker is created through the site's launcher. Just before the
launch it asks the revocation list again (the newest it holds: one may have come since the
check) and whether the job was aborted meanwhile; a newer list aborts the running jobs it
revokes here, whether or not the server says so (`signers_revoked`).

Every identifier in a command is checked against its grammar (spec/names.py) before any use,
and nothing touches the filesystem until the job passed every check: the job is fetched and
verified in scratch folders (the site's tmp/ for the zip, .fetching/ beside the run folders for
its files: spec/run_folders.py), and only an accepted job becomes a run folder
(jobs/<job id>) and a kept app (apps/<job id>.zip). A refused job leaves nothing and removes
nothing. The signed statement is bound to the job id it first ran under (site/signed_jobs.py).

A registered worker is watched (`watch`): one that made no call to this parent (its heartbeat
included, every supervision.heartbeat_s) for supervision.stall_s is stopped; its part starts
again once, for the round in flight (the server is told RESTARTING and retries that round's task
for it), and a second stall fails the part with the reason ("site-2's part sent no heartbeat for
120 s during round 3"). The heartbeat comes from a thread of the worker's own, so a script that
hangs (a deadlock, a sleep that never ends) still beats: a worker that holds a task and shows no
progress (site/worker_backend.py: no other call, no bytes of the task or its reply moving) for
supervision.progress_s stalls the same way, with a reason that says so. A dispatch of a job that
already runs here is the server taking back a restarted site: it is ignored.

A worker an earlier parent of this site launched that still runs (a container, pod or Slurm job)
is taken back (`adopt`, site/running_parts.py): its job runs here again from what that parent
kept, and its worker registers again with the job's token, accepted once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.base.files import PRIVATE, private_dir
from atoll.base.reasons import public
from atoll.launchers.base import RENDER_DIGEST, Handle, LaunchError, Outcome, WorkerExit
from atoll.launchers.job_files import JobFileError, read_tail
from atoll.site.job_log import JobLog
from atoll.site.running_parts import Rejoin, RunningParts
from atoll.site.signed_jobs import Replayed, SignedJobs
from atoll.spec.admission import asked_at, fits
from atoll.spec.errors import EXIT_INVALID, AtollError, SpecError
from atoll.spec.names import IdentifierError, check_job_id, check_study_name
from atoll.spec.run_folders import FETCH_SCRATCH, JOBS
from atoll.wire import frames
from atoll.wire import messages as msg

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher, LaunchRequest
    from atoll.parent.worker_endpoint import WorkerTokens
    from atoll.pki.job_signature import Signed
    from atoll.pki.kit import Kit
    from atoll.site.job_acceptance import Accepted
    from atoll.site.task_stream import TaskStream
    from atoll.spec.meta_plain import Meta
    from atoll.spec.resources import Resources
    from atoll.spec.study_runtime import StudyEntry, StudyRuntime
    from atoll.wire.handoff import HandoffDir

log = logging.getLogger("atoll.site.supervisor")

WORKER_LOG = Path("logs") / "worker.log"
END_GRACE_S = 30.0  # after the workflow ends, how long a worker may take to wrap up
LOG_TAIL = 64 * 1024
STALL_RESTARTS = 1  # times a stalled part starts again before a stall fails it


@dataclass
class SiteJob:
    job_id: str
    study: str
    workdir: Path
    resources: Resources  # what the job was admitted with; its launch request asks the same
    # local/study_runtime.yaml as read at admission, and the job's study in it: its launch
    # request uses them rather than reading the file again
    runtime: StudyRuntime | None = None
    entry: StudyEntry | None = None
    handle: Handle | None = None
    ended: threading.Event = field(default_factory=threading.Event)
    aborting: str | None = None
    report: tuple[bool, str] | None = None
    handoff: HandoffDir | None = None  # made when its worker registers (site/worker_backend.py)
    tasks: TaskStream | None = None  # its call for tasks and replies, from its first pull
    # The parent's own copy of the app, served to a worker that asks (FetchApp). Outside the run
    # folder: what the job can write there (a link in place of app.zip) is never served.
    app_zip: Path | None = None
    signed: Signed | None = None  # who signed the job, once it passed the site's checks
    last_beat: float | None = None  # the worker's last call (monotonic); None: not registered
    # While its worker holds a task (took one, has not replied): its last sign of progress
    # (monotonic; site/worker_backend.py). None: it holds none.
    progress: float | None = None
    round: Any = None  # the round of the last task its worker took
    restart: str | None = None  # why its worker is being replaced (a stall), while it is
    restarts: int = 0
    stalled: str | None = None  # why the parent stopped its worker for good (a second stall)


class NotAdmitted(AtollError):
    """The site cannot take the job now: its study is not mapped here, the job already runs,
    or the job does not fit the capacity left; the message is the reason its status shows."""

    exit_code = EXIT_INVALID


class LaunchHost(Protocol):
    """What the site parent lends its supervisor (site/app.py): its launcher, its capacity and
    study_runtime.yaml as they are now, the folder holding its run folders
    (spec/run_folders.py), and the launch request of an admitted job."""

    @property
    def launcher(self) -> Launcher: ...

    def capacity(self) -> dict[str, Any]: ...

    def study_runtime(self) -> StudyRuntime: ...

    def runs_root(self) -> Path: ...

    def launch_request(self, job: SiteJob, name: str, meta: Meta,
                       token: str) -> LaunchRequest: ...

    def rejoin_to(self) -> str | None:
        """Where this parent's workers dial it, as its successor must listen again for one to
        re-attach (site/running_parts.py); None: re-attach is off, or not for this launcher."""
        ...


class StateReports(Protocol):
    """The link that reports a job's states to the server (site/connection.py)."""

    def send_state(self, job_id: str, state: str, reason: str = "", **extra: Any) -> None: ...


class JobFetch(Protocol):
    """The server's FetchJob call (the parent's Federation stub)."""

    def FetchJob(self, request: Any) -> Iterable[bytes]: ...


class Supervisor:
    def __init__(self, kit: Kit, host: LaunchHost, link: StateReports, server: JobFetch,
                 tokens: WorkerTokens):
        self.kit = kit  # this site's name, workspace, and what job_acceptance checks against
        self.host = host
        self.link = link
        self.server = server
        self.tokens = tokens
        self.jobs: dict[str, SiteJob] = {}
        # dispatched, not admitted yet (its thread parses the meta first): an abort that comes
        # meanwhile waits here for it, with its reason
        self._arriving: dict[str, str | None] = {}
        self.signed_jobs = SignedJobs(kit.workspace)  # each signed statement under one job id
        self.job_log = JobLog(kit.workspace)  # every job run or refused here (site jobs KIT)
        self.parts = RunningParts(kit.workspace)  # its workers' handles, for its successor
        self.leaving = False  # the parent stops and leaves its workers to its successor
        self._lock = threading.Lock()

    def running_jobs(self) -> list[str]:
        with self._lock:
            return list(self.jobs)

    def job(self, job_id: str) -> SiteJob | None:
        return self.jobs.get(job_id)

    def dispatch(self, body: dict[str, Any]) -> None:
        try:  # the id names the job's thread, folder and state: checked before anything
            job_id = check_job_id(body.get("job_id"))
        except IdentifierError as exc:
            log.warning("refused a dispatch from the server: %s", exc)
            if isinstance(body.get("job_id"), str):  # the server hears why, if it can match it
                self.link.send_state(body["job_id"], "FINISHED:FAILED",
                                     f"{self.kit.name} refused the job: {exc}")
            return
        with self._lock:
            # the server taking back a site whose link broke: the job runs here already
            if job_id in self.jobs or job_id in self._arriving:
                log.info("job %s: dispatched again, and runs here already", job_id)
                return
            self._arriving[job_id] = None
        threading.Thread(target=self._run, args=(body,), daemon=True,
                         name=f"job-{job_id[:8]}").start()

    def _report(self, job_id: str, state: str, reason: str = "", **extra: Any) -> None:
        workdir = self.host.runs_root() / JOBS / job_id  # paths relative to the job's folder
        reason = public(reason, [workdir], self.kit.workspace)
        self.link.send_state(job_id, state, reason, **extra)

    def _admit(self, job_id: str, study: str, meta) -> SiteJob:
        site = self.kit.name
        runtime = self.host.study_runtime()  # read once per launch: the request gets it
        entry = runtime.entry(study)
        if entry is None:
            raise NotAdmitted(f"site {site} does not map study {study!r} in its local/"
                              "study_runtime.yaml; the site operator must add it")
        resources = asked_at(meta, site, self.host.launcher.name)
        with self._lock:
            if job_id in self.jobs:
                raise NotAdmitted(f"job {job_id} is already running at {site}")
            used = [j.resources for j in self.jobs.values()]
            short = fits(self.host.capacity(), used, resources)
            if short:
                raise NotAdmitted(f"site {site} has no room for the job: {short}")
            job = SiteJob(job_id, study, self.host.runs_root() / JOBS / job_id, resources,
                          runtime, entry)
            job.aborting = self._arriving.pop(job_id, None)
            self.jobs[job_id] = job
        return job

    def _run(self, body: dict[str, Any]) -> None:
        # The spec models import pydantic, zipfile weighs ~1 MiB, and shutil brings bz2 and
        # lzma: all are loaded by the first job, not in a parent at rest.
        import zipfile

        from atoll.site.job_acceptance import JobRefused, check_revoked
        from atoll.spec.meta_plain import check_meta
        from atoll.wire.job_archive import IntakeError

        job_id, site = check_job_id(body.get("job_id")), self.kit.name
        job = None
        try:
            study = check_study_name(body.get("study"))
            served = body.get("meta")
            if not isinstance(served, dict):  # a document, never a path to read
                raise NotAdmitted(f"{site} refused the job: the server sent no meta document")
            dispatched = check_meta(served)  # checked once here; job_acceptance compares it
            job = self._admit(job_id, study, dispatched)
            if job.aborting:  # aborted on its way here: nothing fetched, nothing started
                self._forget(job_id, job)
                self._report(job_id, "FINISHED:ABORTED", job.aborting)
                return
            accepted = self._fetch(job, body, dispatched)
            meta, job.signed = accepted.meta, accepted.signed  # what the submitter signed
            check_revoked(site, accepted.signed)  # with the newest list, just before launch
            if job.aborting:  # aborted while it was fetched and checked: it never starts
                self._forget(job_id, job)
                self._report(job_id, "FINISHED:ABORTED", job.aborting)
                return
            token = self.tokens.issue(job_id)
            # the signed meta's name, not the server's word for it
            request = self.host.launch_request(job, meta.name, meta, token)
            self._report(job_id, "STARTING", f"launching through {self.host.launcher.name}")
            job.handle = self.host.launcher.launch(
                request, on_progress=lambda text: self._report(job_id, "STARTING", text))
            self.parts.launched(job.handle, self._rejoin(job, token))
            self.job_log.record(job_id, study, "launched", job.signed)
            entries = self._provenance(job, self._launched_image(job))
            if entries:  # a report of its own: never a state after the worker's RUNNING
                self.link.send_state(job_id, "PROVENANCE", "", **entries)
        except (NotAdmitted, JobRefused, Replayed, SpecError, LaunchError, IntakeError, OSError,
                IdentifierError, zipfile.BadZipFile) as exc:
            reason = (str(exc) if isinstance(exc, NotAdmitted | JobRefused | Replayed)
                      else f"{site} refused the job: {exc}")
            signed = (job.signed if job else None) or getattr(exc, "signed", None)
            self.job_log.record(job_id, str(body.get("study")), "refused", signed, reason,
                                str(body.get("submitter", "")))
            if signed is not None:  # a decision of this site about a job it verified
                self._refused_entry(job_id, signed, reason)
            self._forget(job_id, job)
            self._report(job_id, "FINISHED:FAILED", reason)
            return
        except Exception as exc:  # noqa: BLE001 - report rather than die silently
            log.exception("job %s failed to start", job_id)
            self.job_log.record(job_id, str(body.get("study")), "refused",
                                job.signed if job else None, f"could not start: {exc}")
            self._forget(job_id, job)
            self._report(job_id, "FINISHED:FAILED", f"{site} could not start the job: {exc}")
            return
        if job.aborting:
            self.host.launcher.cancel(job.handle)
        while True:
            exit = self.host.launcher.wait(job.handle)
            if job.restart is None or job.aborting or not self._relaunch(job, meta):
                break
        self._finish(job, exit)

    def _relaunch(self, job: SiteJob, meta: Meta) -> bool:
        """Start the part of a job whose worker was stopped (a stall) again; False, with its
        report set, if it cannot be."""
        why, job.restart = job.restart, None
        job.last_beat, job.progress, job.report = None, None, None
        try:
            self.tokens.revoke(job.job_id)  # the old worker's session ends with it
            token = self.tokens.issue(job.job_id)
            request = self.host.launch_request(job, meta.name, meta, token)
            self._report(job.job_id, "RESTARTING", f"{why}; its part starts again")
            job.handle = self.host.launcher.launch(
                request, on_progress=lambda text: self._report(job.job_id, "STARTING", text))
            self.parts.launched(job.handle, self._rejoin(job, token))
        except Exception as exc:  # noqa: BLE001 - the part fails with both reasons
            log.exception("job %s could not start again", job.job_id)
            job.report = (False, f"{why}; it could not start again: {exc}")
            return False
        log.warning("job %s: %s; its part starts again", job.job_id, why)
        return True

    # -- re-attach -------------------------------------------------------------------------------
    def _rejoin(self, job: SiteJob, token: str) -> Rejoin | None:
        """What this parent's successor needs to take the job's worker back, if it may."""
        import dataclasses

        address = self.host.rejoin_to()
        if address is None:
            return None
        signed = None
        if job.signed is not None:
            s = job.signed
            signed = {"signer": vars(s.signer), "cert": s.cert_pem.decode("ascii"),
                      "statement": dataclasses.asdict(s.statement),
                      "statement_digest": s.statement_digest}
        return Rejoin(token, address, job.study, dataclasses.asdict(job.resources), signed)

    def adopt(self, handle: Handle, rejoin: Rejoin) -> bool:
        """Take back the running worker of an earlier parent of this site: its job runs here
        again (RUNNING once it registers with its token: nothing is dispatched again), and its
        end is reported as any other's. False if it cannot be: it is then stopped."""
        from atoll.spec.resources import Resources

        try:
            signed = _signed_of(rejoin.signed) if rejoin.signed is not None else None
            job = SiteJob(handle.job_id, check_study_name(rejoin.study),
                          self.host.runs_root() / JOBS / handle.job_id,
                          Resources(**rejoin.resources), handle=handle, signed=signed)
        except (TypeError, ValueError, KeyError, IdentifierError) as exc:
            log.warning("job %s: its worker is not taken back: %s", handle.job_id, exc)
            return False
        job.restarts = STALL_RESTARTS  # no launch request here to start it again: a stall fails it
        job.last_beat = time.monotonic()  # watched at once: a worker that never comes back stalls
        app_zip = self.kit.workspace / "apps" / f"{handle.job_id}.zip"
        job.app_zip = app_zip if app_zip.is_file() else None
        with self._lock:
            if handle.job_id in self.jobs:
                return False
            self.jobs[handle.job_id] = job
        self.tokens.expect(handle.job_id, rejoin.token)
        self.parts.launched(handle, rejoin)  # and its successor's, if this parent dies too
        log.warning("job %s: took back the worker an earlier site parent left (%s)",
                    handle.job_id, handle.native_id)
        threading.Thread(target=self._watch_adopted, args=(job,), daemon=True,
                         name=f"job-{handle.job_id[:8]}").start()
        return True

    def _watch_adopted(self, job: SiteJob) -> None:
        try:
            exit = self.host.launcher.wait(job.handle)
        except Exception as exc:  # noqa: BLE001 - reported rather than lost
            log.exception("job %s: lost its worker", job.job_id)
            exit = WorkerExit(Outcome.FAILED, f"the site parent lost its worker: {exc}")
        self._finish(job, exit)

    # -- stalls ----------------------------------------------------------------------------------
    def watch(self, stall_s: float, progress_s: float, stopped: threading.Event) -> None:
        """Stop each worker that went stall_s without a call to this parent, or held a task
        progress_s without progress (a thread)."""
        def run() -> None:
            while not stopped.wait(min(1.0, stall_s / 4, progress_s / 4)):
                now = time.monotonic()
                for job in list(self.jobs.values()):
                    beat, progress = job.last_beat, job.progress
                    if (beat is None or job.handle is None or job.aborting
                            or job.restart is not None or job.ended.is_set()):
                        continue
                    if now - beat > stall_s:
                        self._stalled(job, f"{self.kit.name}'s part sent no heartbeat for "
                                           f"{stall_s:g} s{self._during(job)}")
                    elif progress is not None and now - progress > progress_s:
                        self._stalled(job, f"{self.kit.name}'s part held its task{self._of(job)} "
                                           f"for {progress_s:g} s with no call to the client "
                                           "API, no bytes moving and no progress report "
                                           "(supervision.progress_s): its script may hang")

        threading.Thread(target=run, name="stall-watch", daemon=True).start()

    @staticmethod
    def _during(job: SiteJob) -> str:
        return f" during round {job.round}" if job.round is not None else ""

    @staticmethod
    def _of(job: SiteJob) -> str:
        return f" of round {job.round}" if job.round is not None else ""

    def _stalled(self, job: SiteJob, why: str) -> None:
        log.warning("job %s: %s", job.job_id, why)
        job.last_beat = job.progress = None
        if job.restarts < STALL_RESTARTS:
            job.restarts += 1
            job.restart = why
        else:
            job.stalled = why
        self.host.launcher.cancel(job.handle)

    def _provenance(self, job: SiteJob, extra: dict[str, Any]) -> dict[str, Any]:
        """This site's signed entries for the job's provenance record (site/provenance.py)."""
        from atoll import __version__
        from atoll.pki.provenance import switched_off
        from atoll.site.provenance import decision_body, launch_body, sign_entries

        if job.signed is None or switched_off():
            return {}
        try:  # the job runs already: nothing here may fail it
            bodies = [("site.decision", decision_body(self.kit, job.study, job.signed)),
                      ("site.launch", launch_body(self.host.launcher.name, job.entry, extra,
                                                  __version__))]
            return sign_entries(self.kit, job.job_id, job.signed, bodies)
        except Exception:  # noqa: BLE001 - the record lacks them; the site's log has the job
            log.exception("job %s: its provenance entries were not made", job.job_id)
            return {}

    def _launched_image(self, job: SiteJob) -> dict[str, Any]:
        """The image the worker runs and its digest, as the launcher learns it (a Pod's once
        its container started): the launch entry waits for it, the job does not; and the
        digest of what the launcher rendered (launchers/base.py)."""
        rendered = job.handle.extra.get(RENDER_DIGEST) if job.handle is not None else None
        try:
            image = dict(self.host.launcher.launched_image(job.handle))
        except Exception:  # noqa: BLE001 - the entry then names no digest
            log.exception("job %s: its image's digest was not learnt", job.job_id)
            image = {}
        return {**image, **({RENDER_DIGEST: rendered} if rendered else {})}

    def _refused_entry(self, job_id: str, signed: Signed, reason: str) -> None:
        from atoll.pki.provenance import switched_off
        from atoll.site.provenance import sign_entries

        if switched_off():
            return
        try:  # a refusal stays a refusal, whatever happens here
            workdir = self.host.runs_root() / JOBS / job_id  # as _report: no path of the site
            body = {"decision": "refused", "study": signed.statement.study,
                    "submitter": signed.signer.name, "content_digest": signed.digest,
                    "reason": public(reason, [workdir], self.kit.workspace)[:2000]}
            entries = sign_entries(self.kit, job_id, signed, [("site.decision", body)])
        except Exception:  # noqa: BLE001
            log.exception("job %s: the provenance entry of its refusal was not made", job_id)
            return
        if entries:
            self.link.send_state(job_id, "PROVENANCE", "", **entries)

    def _fetch(self, job: SiteJob, body: dict[str, Any], dispatched: Meta) -> Accepted:
        """Fetch this site's app and check it (its signature, content and policy, and that its
        signed statement is not replayed under a new id) in a scratch folder of the site's
        tmp/; only then make it the job's private run folder, and keep the zip (outside the
        folder) for workers that cannot see this folder."""
        import shutil
        import tempfile

        from atoll.site.job_acceptance import check_job
        from atoll.wire.job_archive import unpack_app

        workspace = self.kit.workspace
        scratch = Path(tempfile.mkdtemp(prefix=f"fetch-{job.job_id}-",
                                        dir=private_dir(workspace / "tmp")))
        # The run folder is unpacked beside the run folders, so that the accepted job is renamed
        # into place on their file system (slurm.workspace is often not the kit's).
        staging = Path(tempfile.mkdtemp(prefix=f"{job.job_id}-",
                                        dir=private_dir(self.host.runs_root() / FETCH_SCRATCH)))
        try:
            fetched = scratch / "app.zip"
            stream = self.server.FetchJob(msg.JobRef(job_id=job.job_id))
            _, chunks = frames.split(iter(stream))
            frames.write_chunks(chunks, fetched, limit=1 << 31)
            fetched.chmod(PRIVATE)
            accepted: list[Accepted] = []

            def check(tree: Path) -> Meta:  # verified and parsed once; unpacking reuses it
                accepted.append(check_job(tree, body, self.kit, dispatched=dispatched))
                return accepted[0].meta

            run = private_dir(staging / "run")
            unpack_app(fetched, self.kit.name, run / "app", staging, check=check)
            signed = accepted[0].signed
            self.signed_jobs.claim(signed.statement_digest, job.job_id, self.kit.name,
                                   signed.signer.name)
            private_dir(run / "logs")
            # Accepted: the job's own earlier run folder (a resume under its id) gives way.
            shutil.rmtree(job.workdir, ignore_errors=True)
            private_dir(job.workdir.parent)
            run.rename(job.workdir)
            job.app_zip = private_dir(workspace / "apps") / f"{job.job_id}.zip"
            fetched.replace(job.app_zip)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(staging, ignore_errors=True)
        log.info("job %s: signed by %s (%s), content %s, statement %s", job.job_id,
                 signed.signer.name, signed.signer.role, signed.digest, signed.statement_digest)
        return accepted[0]

    def _finish(self, job: SiteJob, exit: WorkerExit) -> None:
        if self.leaving:  # its worker runs on for the next parent: its entry stays, unreported
            log.info("job %s: left running for the next site parent", job.job_id)
            return
        if job.aborting:
            state, reason = "ABORTED", job.aborting
        elif job.stalled:  # whatever the stopped worker said as it went
            state, reason = "FAILED", job.stalled
        elif exit.outcome is Outcome.COMPLETED and (job.report is None or job.report[0]):
            state, reason = "COMPLETED", ""
        else:
            state = "FAILED"
            reason = job.report[1] if job.report and job.report[1] else exit.reason
        self.job_log.record(job.job_id, job.study, f"finished:{state}", job.signed, reason)
        tail = self._tail(job)
        self._forget(job.job_id, job)
        self._report(job.job_id, f"FINISHED:{state}", reason, log_tail=tail)

    def _forget(self, job_id: str, job: SiteJob | None) -> None:
        """Free what the job held here (its room, token, app zip, handoff folder): before its
        FINISHED goes out, which may bring the next job at once (the server's scheduler is
        woken by it) that must find the room."""
        self.tokens.revoke(job_id)
        with self._lock:
            self._arriving.pop(job_id, None)  # refused before admission
            if job is not None and self.jobs.get(job_id) is job:
                del self.jobs[job_id]
        if job is not None and job.handle is not None:
            self.parts.ended(job_id)
        if job is not None and job.app_zip is not None:
            job.app_zip.unlink(missing_ok=True)
        if job is not None and job.tasks is not None:
            job.tasks.close()
        if job is not None and job.handoff is not None:
            import shutil

            job.handoff.close()  # and what a worker that died left in it goes with it
            shutil.rmtree(job.handoff.path, ignore_errors=True)

    @staticmethod
    def _tail(job: SiteJob) -> str:
        """The end of the worker's log, read as the job's file: never through a link it planted
        (to /proc/<this parent>/environ, say), which would ship this parent's secrets."""
        rel = WORKER_LOG
        named = job.handle.extra.get("log_file") if job.handle is not None else None
        if named and Path(named).is_relative_to(job.workdir):  # Slurm's logs/slurm-<id>.out
            rel = Path(named).relative_to(job.workdir)
        try:
            return read_tail(job.workdir, rel, LOG_TAIL).decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        except OSError as exc:  # a link, a FIFO, a hard link...: say so instead
            log.warning("job %s: the worker's log was not read: %s", job.job_id, exc)
            why = exc if isinstance(exc, JobFileError) else exc.strerror  # no site path
            return f"[atoll: the site parent did not read the worker's log: {why}]\n"

    # -- commands from the server ---------------------------------------------------------------
    def abort(self, job_id: str, reason: str) -> None:
        if not _known_id(job_id, "abort"):
            return
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                if job_id in self._arriving:  # its thread takes the abort at admission
                    self._arriving[job_id] = self._arriving[job_id] or reason
                return
        job.aborting = job.aborting or reason
        job.ended.set()
        if job.handle is not None:
            threading.Thread(target=self.host.launcher.cancel, args=(job.handle,),
                             daemon=True).start()

    def signers_revoked(self) -> list[str]:
        """A newer revocation list is in force: abort the jobs here that a revoked user
        signed (site/revocation.py); the ids of those aborted."""
        from atoll.site.job_acceptance import revoked

        aborted = []
        for job in list(self.jobs.values()):
            # one not checked yet: its check, or the one just before launch, asks the new list
            why = revoked(job.signed) if job.signed is not None else None
            if why:
                log.warning("job %s: aborting: %s", job.job_id, why)
                self.abort(job.job_id, f"aborted by {self.kit.name}: {why}")
                aborted.append(job.job_id)
        return aborted

    def end(self, job_id: str) -> None:
        if not _known_id(job_id, "end"):
            return
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.ended.set()

        def overdue() -> None:
            if self.jobs.get(job_id) is job and job.handle is not None:
                job.report = (False, f"did not exit within {END_GRACE_S:.0f} s of the "
                                     "workflow's end")
                self.host.launcher.cancel(job.handle)

        timer = threading.Timer(END_GRACE_S, overdue)
        timer.daemon = True
        timer.start()

    def stop_all(self) -> None:
        for job in list(self.jobs.values()):
            job.aborting = job.aborting or "the site parent stopped"
            if job.handle is not None:
                self.host.launcher.cancel(job.handle)


def _signed_of(doc: dict[str, Any]) -> Signed:
    """Who signed a job taken back, as its earlier parent verified it (site/running_parts.py:
    the parent's own file), so that a newer revocation list still aborts it."""
    from atoll.pki.identity import Identity
    from atoll.pki.job_signature import Signed, Statement

    return Signed(Identity(**doc["signer"]), Statement(**doc["statement"]),
                  str(doc["cert"]).encode("ascii"), str(doc["statement_digest"]))


def _known_id(job_id: object, command: str) -> bool:
    """A command's job id is of the grammar (a bad one names no job here: it is logged)."""
    try:
        check_job_id(job_id)
    except IdentifierError as exc:
        log.warning("ignored an %s command from the server: %s", command, exc)
        return False
    return True
