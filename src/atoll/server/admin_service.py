"""The Admin service: what admins call (CLI, Session), scoped to one study per call.

Each call's study is the one the caller's signed session token names, or a one-off `study` in
the request; membership is checked on every call. A job of another study answers exactly like
a job that does not exist.

Before a byte of a request is read (`admit`, see wire/guard.py), the call must come with an
admin certificate within its limits (server/auth.py), a session token only if this server signed
it for that certificate's user, and, for Submit, a role that may submit. Every refusal past that
point (another study, another study's job, what a role may not do) is an audit entry naming the
certificate. `Call` runs on the event loop and its work beside it; a status long poll holds a
future, not a thread. Submit and Download run on the handler threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from atoll.launchers.job_files import JobFileError, read_tail
from atoll.pki.identity import Identity
from atoll.server.auth import (
    AuditThrottle,
    Gate,
    PeerRefused,
    cert_note,
    peer_fingerprint,
    peer_identity,
    peer_identity_async,
    soon,
)
from atoll.server.jobs import job_summary
from atoll.server.sessions import Grant, SessionSigner
from atoll.server.site_links import SiteLinks
from atoll.server.site_policies import SitePolicies
from atoll.server.store import JobRecord
from atoll.server.studies import DEFAULT, SUBMIT_ROLES, Denied, Members
from atoll.server.waiters import StoreChanges
from atoll.spec.errors import EXIT_NOT_FOUND, AtollError
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.job_archive import IntakeError

if TYPE_CHECKING:
    from atoll.server.store import Store

log = logging.getLogger("atoll.server.admin")
LOG_TAIL_BYTES = 256 * 1024
MAX_WAIT_S = 20.0  # a status long-poll answers at least this often
SESSION_KEY = "x-atoll-session"
ACTIONS = {"abort_job": "abort", "delete_job": "delete"}  # an operation's name in the audit log, where it differs
# Operations on one study's jobs and sites: never without a study its caller is in.
STUDY_SCOPED = {"list_jobs", "job_status", "job_logs", "abort_job", "delete_job", "list_sites"}


class NoSuchJob(AtollError):
    exit_code = EXIT_NOT_FOUND

    def __init__(self, job_id: str, detail: str = "no such job"):
        super().__init__(job_id)
        self.detail = detail  # for the audit log only: the caller learns nothing more


# An operation: (caller, study, request body) -> the answer, as JSON-able values.
Op = Callable[[Identity, str, dict[str, Any]], Any]


class AdminJobs(Protocol):
    """What admins do to jobs (server/jobs.py): their folders, intake and abort."""

    @property
    def jobs_dir(self) -> Path: ...

    def submit(self, who: Identity, study: str, chunks: Iterator[bytes]) -> JobRecord: ...

    def abort(self, job_id: str, reason: str) -> None: ...


class AdminService:
    def __init__(self, *, store: Store, studies: Members, jobs: AdminJobs, links: SiteLinks,
                 signer: SessionSigner, ops: Mapping[str, Op], scratch: Path,
                 stopping: Callable[[], bool]):
        """``ops``: the operations served beside the service's own (studies, revocations);
        ``scratch``: where a download's zip is built."""
        self.store = store
        self.studies = studies
        self.jobs = jobs
        self.links = links
        self.signer = signer
        self.scratch = scratch
        self.ops: dict[str, Op] = {
            "login": self.login, "whoami": self.whoami, "list_jobs": self.list_jobs,
            "job_status": self.job_status, "job_logs": self.job_logs, "abort_job": self.abort_job,
            "delete_job": self.delete_job,
            "list_sites": self.list_sites, "audit": self.audit_log,
        }
        self.ops.update(ops)
        self.gate = Gate("Admin", "admin", store)
        self.site_policies = SitePolicies(links)
        self.changes = StoreChanges(store, stopping)
        self._known: set[Identity] = set()
        self._audits = AuditThrottle()

    # -- before the request is read -------------------------------------------------------------
    async def admit(self, context, method: str):
        """wire/guard.py's admission: the release to call when the call ends, or an abort."""
        try:
            who, release = self.gate.enter(context, method)
        except PeerRefused as exc:
            await context.abort(exc.code, exc.details)
        try:
            self._grant(context, who)
            if method == "Submit" and who.role not in SUBMIT_ROLES:
                raise PeerRefused(grpc.StatusCode.PERMISSION_DENIED,
                                  f"{who.name} is a {who.role}; submitting jobs needs one of "
                                  f"{', '.join(SUBMIT_ROLES)}")
        except PeerRefused as exc:
            release()
            soon(self._refused, who, peer_fingerprint(context), "-",
                 "submit" if method == "Submit" else "session", "-", exc.details)
            await context.abort(exc.code, exc.details)
        return release

    def _grant(self, context, who: Identity) -> Grant | None:
        """The caller's session, if it sent one; refused if this server did not sign it for the
        caller (an expired one is refused only where it is used: a one-off study needs none)."""
        token = dict(context.invocation_metadata()).get(SESSION_KEY)
        if not token:
            return None
        grant = self.signer.check(token, who.name)
        if grant is None:
            raise PeerRefused(grpc.StatusCode.UNAUTHENTICATED,
                              "this session token was not issued to you by this server; run "
                              "`atoll login` again")
        return grant

    # -- plumbing (on the loop or a thread: refusals are raised, the caller aborts) -------------
    def _study(self, context, who: Identity, body: dict[str, Any]) -> str:
        study = body.get("study")
        if not isinstance(study, str | None):
            raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT, "study must be a study's name")
        if study:
            return study
        grant = self._grant(context, who)
        if grant is not None and grant.expired:
            raise PeerRefused(grpc.StatusCode.UNAUTHENTICATED,
                              "your session expired; run `atoll login` again")
        return grant.study if grant is not None else DEFAULT

    @staticmethod
    def _body(request) -> dict[str, Any]:
        try:
            body = json.loads(request.body or "{}")
        except (ValueError, RecursionError):
            raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT,
                              "request body is not JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("op", ""), str):
            raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT, 'request body must be a JSON '
                              'object such as {"op": "list_jobs"}')
        return body

    def _remember(self, who: Identity) -> None:
        if who not in self._known:  # once per certificate, not a write on every call
            self.studies.remember_user(who)
            self._known.add(who)

    async def Call(self, request, context):
        who = await peer_identity_async(context, "admin")  # admitted: a cache hit
        fingerprint = peer_fingerprint(context)
        try:
            body = self._body(request)
            name = body.get("op", "")
            op = self.ops.get(name)
            if op is None:
                raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"unknown operation {name!r}")
            study = self._study(context, who, body)
            wait_s = self._wait_s(body) if name == "job_status" else 0.0
        except PeerRefused as exc:
            await context.abort(exc.code, exc.details)
        loop = asyncio.get_running_loop()
        refusal = None
        if wait_s:  # wait here, on the loop, for a job that can still change
            text, refusal = await loop.run_in_executor(
                None, self._run, self._unfinished, name, who, fingerprint, study, body)
            if refusal is None and json.loads(text):
                await self.changes.wait(body["since"], wait_s)
        if refusal is None:
            text, refusal = await loop.run_in_executor(
                None, self._run, op, name, who, fingerprint, study, body)
        if refusal is not None:
            await context.abort(refusal.code, refusal.details)
        return msg.Json(body=text)

    def _run(self, op, name: str, who: Identity, fingerprint: str, study: str,
             body: dict[str, Any]) -> tuple[str, PeerRefused | None]:
        """An operation on a thread: (its answer as JSON, or the refusal to answer with)."""
        self._remember(who)
        action = ACTIONS.get(name, name)
        try:
            # Without a study (`default`), what is not about one study's jobs and sites runs
            # as before `default` was scoped (everybody was in it): each op checks its caller.
            if name != "login" and (name in STUDY_SCOPED or study != DEFAULT):
                self.studies.require_member(who, study)
            return json.dumps(op(who, study, body)), None
        except NoSuchJob as exc:
            self._refused(who, fingerprint, study, action, str(exc), exc.detail)
            return "", PeerRefused(grpc.StatusCode.NOT_FOUND, f"no such job: {exc}")
        except Denied as exc:
            one_off = " (a one-off --study)" if body.get("study") else ""
            self._refused(who, fingerprint, study, action, _target(body, study),
                          f"{exc}{one_off}")
            return "", PeerRefused(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except ValueError as exc:
            return "", PeerRefused(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    @staticmethod
    def _wait_s(body: dict[str, Any]) -> float:
        """How long a status call may wait for a change: 0 without `since` and `wait_s`."""
        since, wait_s = body.get("since"), body.get("wait_s")
        if not isinstance(since, int) or isinstance(since, bool) or not wait_s:
            return 0.0
        try:
            wait_s = float(wait_s)
        except (TypeError, ValueError):
            raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT,
                              "wait_s must be a number of seconds") from None
        return min(wait_s, MAX_WAIT_S) if math.isfinite(wait_s) and wait_s > 0 else 0.0

    def _job(self, study: str, job_id: Any) -> JobRecord:
        record = self.store.get_job(str(job_id))
        if record is None:
            raise NoSuchJob(str(job_id))
        if record.study != study:
            raise NoSuchJob(str(job_id), f"the job is in study {record.study}")
        return record

    def _audit(self, who: Identity, study: str, action: str, target: str, outcome: str,
               detail: str = "") -> None:
        self.store.audit(who.name, who.org, who.role or "", study, action, target, outcome,
                                detail)

    def _refused(self, who: Identity, fingerprint: str, study: str, action: str, target: str,
                 detail: str) -> None:
        """An audit entry for a refused call (repeats of one are counted: auth.AuditThrottle)."""
        target = target[:200]
        suffix = self._audits.note((fingerprint, study, action, target))
        if suffix is not None:
            self._audit(who, study, action, target, "refused",
                        f"{detail[:500]}{suffix} {cert_note(fingerprint)}")

    @staticmethod
    def _may_manage(who: Identity, record: JobRecord) -> bool:
        if who.role == "project_admin" or who.name == record.submitter:
            return True
        return who.role == "org_admin" and who.org == record.submitter_org

    def _sites_allow(self, who: Identity, record: JobRecord, right: str, verb: str) -> None:
        """Denied when a site of the job refuses ``right`` to ``who`` by its own policy
        (server/site_policies.py); a site can only narrow what _may_manage allows."""
        why = self.site_policies.refusal(who, record, right)
        if why is not None:
            raise Denied(f"{who.name} ({who.role}) may not {verb} {record.submitter}'s job: {why}")

    # -- operations ----------------------------------------------------------------------------
    def login(self, who, study, body):
        self.studies.require_member(who, study)  # a refusal is audited by _run
        self._audit(who, study, "login", study, "ok")
        return {"token": self.signer.issue(who.name, study), "study": study,
                "user": who.name, "org": who.org, "role": who.role}

    def whoami(self, who, study, body):
        return {"user": who.name, "org": who.org, "role": who.role, "study": study,
                "studies": self.studies.visible(who)}

    def list_jobs(self, who, study, body):
        return {"jobs": [job_summary(r) for r in self.store.list_jobs(study=study)]}

    def _unfinished(self, who, study, body) -> bool:
        return not self._job(study, body.get("job_id")).finished

    def job_status(self, who, study, body):
        """A job's status. With `since` (the `version` of an earlier answer) and `wait_s`, Call
        first waits up to wait_s for anything to change: watchers need no polling loop."""
        version = self.store.version  # read before the record: never miss a change
        record = self._job(study, body.get("job_id"))
        out = job_summary(record)
        out["version"] = version
        out["progress"] = self.store.recent_events(record.id)
        return out

    def job_logs(self, who, study, body):
        record = self._job(study, body.get("job_id"))
        folder = self.jobs.jobs_dir / record.id
        logs = {}
        # The server worker's log is the job's file, the sites' tails this parent's copies: all
        # are read without following a link the job could have planted (launchers/job_files.py).
        for name, rel in [("server", "run/server/logs/worker.log"), *sorted(
                (p.stem, f"logs/{p.name}") for p in (folder / "logs").glob("*.log"))]:
            try:
                logs[name] = read_tail(folder, rel, LOG_TAIL_BYTES).decode("utf-8", "replace")
            except FileNotFoundError:
                continue
            except OSError as exc:  # JobFileError names only the path inside the job's folder
                why = exc if isinstance(exc, JobFileError) else exc.strerror
                logs[name] = f"[atoll: the server did not read this log: {why}]\n"
        return {"job_id": record.id, "logs": logs, "events": self.store.events(record.id)}

    def abort_job(self, who, study, body):
        record = self._job(study, body.get("job_id"))
        if not self._may_manage(who, record):  # audited by _run
            raise Denied(f"{who.name} ({who.role}) may not abort {record.submitter}'s job")
        self._sites_allow(who, record, "manage_job", "abort")
        self.jobs.abort(record.id, f"aborted by {who.name}")
        self._audit(who, study, "abort", record.id, "ok")
        return job_summary(self.store.get_job(record.id))

    def delete_job(self, who, study, body):
        """A finished job, gone: its record, progress and results folder. The audit log keeps
        who submitted and who deleted it. A study without jobs can then be removed."""
        import shutil  # with the first delete, not at rest

        record = self._job(study, body.get("job_id"))
        if not self._may_manage(who, record):  # audited by _run
            raise Denied(f"{who.name} ({who.role}) may not delete {record.submitter}'s job")
        self._sites_allow(who, record, "manage_job", "delete")
        if not record.finished:
            raise ValueError(f"job {record.id} is {record.state}; abort it first "
                             f"(`atoll job abort {record.id}`)")
        self.store.delete_job(record.id)
        shutil.rmtree(self.jobs.jobs_dir / record.id, ignore_errors=True)
        self._audit(who, study, "delete", record.id, "ok", f"name={record.name!r} "
                    f"submitter={record.submitter} state={record.state}")
        return {"deleted": record.id, "name": record.name}

    def list_sites(self, who, study, body):
        online = self.links.online()
        sites = []
        for name in self.studies.sites(study):
            link = online.get(name)
            sites.append({"name": name, "online": link is not None,
                          "launcher": link.hello.get("launcher") if link else None,
                          "capacity": link.capacity if link else None,
                          "running_jobs": len(link.running_jobs) if link else 0})
        return {"study": study, "sites": sites}

    def audit_log(self, who, study, body):
        if who.role != "project_admin":
            raise Denied("only project admins may read the audit log")
        only, limit = body.get("only_study"), body.get("limit", 1000)
        if not isinstance(only, str | None) or not isinstance(limit, int):
            raise ValueError("only_study must be a study's name and limit a number of entries")
        return {"entries": self.store.audit_log(study=only, limit=limit)}

    # -- streams -------------------------------------------------------------------------------
    def Submit(self, request_iterator, context):
        """On a handler thread; admitted (the role may submit) and the header already read."""
        who = peer_identity(context, "admin")
        try:
            head, chunks = frames.split(request_iterator)
            study = self._study(context, who, head)
        except frames.FrameError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except PeerRefused as exc:
            context.abort(exc.code, exc.details)
        self._remember(who)
        try:
            self.studies.require_member(who, study)
            record = self.jobs.submit(who, study, chunks)
        except Denied as exc:
            self._refused(who, peer_fingerprint(context), study, "submit", "-", str(exc))
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except (IntakeError, frames.FrameError) as exc:
            self._audit(who, study, "submit", "-", "refused", str(exc)[:500])
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._audit(who, study, "submit", record.id, "ok")
        return msg.Json(body=json.dumps(job_summary(record)))

    def Download(self, request, context):
        import tempfile  # with zipfile: when results are fetched, not in a parent at rest

        from atoll.server.results_zip import write_results_zip

        who = peer_identity(context, "admin")
        try:
            body = self._body(request)
            study = self._study(context, who, body)
        except PeerRefused as exc:
            context.abort(exc.code, exc.details)
        self._remember(who)
        fingerprint = peer_fingerprint(context)
        try:
            self.studies.require_member(who, study)
            record = self._job(study, body.get("job_id"))
            if not self._may_manage(who, record):
                raise Denied(f"{who.name} ({who.role}) may not download {record.submitter}'s job")
            self._sites_allow(who, record, "download_job", "download")
        except NoSuchJob as exc:
            self._refused(who, fingerprint, study, "download", str(exc), exc.detail)
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such job: {exc}")
        except Denied as exc:
            self._refused(who, fingerprint, study, "download", _target(body, study), str(exc))
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        self._audit(who, study, "download", record.id, "ok")
        folder = self.jobs.jobs_dir / record.id
        with tempfile.TemporaryDirectory(dir=self.scratch) as tmp:
            out = write_results_zip(folder, Path(tmp) / "results.zip", job_summary(record))
            yield frames.header({"job_id": record.id, "size": out.stat().st_size})
            for chunk in frames.file_chunks(out):
                yield frames.data(chunk)


def _target(body: dict[str, Any], study: str) -> str:
    """What a refused call was about, for the audit log."""
    for key in ("job_id", "name"):
        if isinstance(body.get(key), str | int):
            return str(body[key])
    return study
