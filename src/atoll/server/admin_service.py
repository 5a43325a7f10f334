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

This module is the servicer alone: it unpacks a call, runs its operation and maps what that
raises to a status code. The operations are plain functions (server/job_ops.py,
session_ops.py, download.py, the studies' and revocations' own); the audit log's entries are
server/audit.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from atoll.pki.identity import Identity
from atoll.server import download, job_ops, session_ops
from atoll.server.audit import Audit, target_of
from atoll.server.auth import (
    Gate,
    PeerRefused,
    peer_fingerprint,
    peer_identity,
    peer_identity_async,
    soon,
)
from atoll.server.job_ops import AdminJobs, JobOps, NoSuchJob, Op
from atoll.server.jobs import job_summary
from atoll.server.sessions import Grant, SessionSigner
from atoll.server.site_links import SiteLinks
from atoll.server.site_policies import SitePolicies
from atoll.server.studies import DEFAULT, SUBMIT_ROLES, Denied, Members
from atoll.server.waiters import StoreChanges
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.bodies import AdminCall, BodyError
from atoll.wire.job_archive import IntakeError

if TYPE_CHECKING:
    from atoll.server.store import Store

log = logging.getLogger("atoll.server.admin")
MAX_WAIT_S = 20.0  # a status long-poll answers at least this often
SESSION_KEY = "x-atoll-session"
ACTIONS = {"abort_job": "abort", "delete_job": "delete"}  # an operation's name in the audit log, where it differs
# Operations on one study's jobs and sites: never without a study its caller is in.
STUDY_SCOPED = {"list_jobs", "job_status", "job_logs", "abort_job", "delete_job", "list_sites"}


class AdminService:
    def __init__(self, *, store: Store, studies: Members, jobs: AdminJobs, links: SiteLinks,
                 signer: SessionSigner, ops: Mapping[str, Op], scratch: Path,
                 stopping: Callable[[], bool]):
        """``ops``: the operations served beside the service's own (studies, revocations);
        ``scratch``: where a download's zip is built."""
        self.store = store
        self.studies = studies
        self.jobs = jobs
        self.scratch = scratch
        self.audit = Audit(store)
        self.deps = JobOps(store=store, studies=studies, jobs=jobs, links=links,
                           policies=SitePolicies(links), audit=self.audit)
        self.signer = signer
        self.ops: dict[str, Op] = {
            **session_ops.ops(session_ops.SessionOps(studies, signer, self.audit)),
            **job_ops.ops(self.deps), **ops}
        self.gate = Gate("Admin", "admin", store)
        self.changes = StoreChanges(store, stopping)
        self._known: set[Identity] = set()

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
        """The call's body, parsed by its one definition (wire/bodies.py)."""
        try:
            return AdminCall.parse(request.body).doc
        except BodyError as exc:
            raise PeerRefused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None

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
            self._refused(who, fingerprint, study, action, target_of(body, study),
                          f"{exc}{one_off}")
            return "", PeerRefused(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except ValueError as exc:
            return "", PeerRefused(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def _unfinished(self, who: Identity, study: str, body: dict[str, Any]) -> bool:
        return job_ops.unfinished(self.deps, who, study, body)

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

    def _refused(self, who: Identity, fingerprint: str, study: str, action: str, target: str,
                 detail: str) -> None:
        self.audit.refused(who, fingerprint, study, action, target, detail)

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
            self.audit.record(who, study, "submit", "-", "refused", str(exc)[:500])
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.audit.record(who, study, "submit", record.id, "ok")
        return msg.Json(body=json.dumps(job_summary(record)))

    def Download(self, request, context):
        who = peer_identity(context, "admin")
        try:
            body = self._body(request)
            study = self._study(context, who, body)
        except PeerRefused as exc:
            context.abort(exc.code, exc.details)
        self._remember(who)
        fingerprint = peer_fingerprint(context)
        try:
            record = download.authorize(self.deps, who, study, body)
        except NoSuchJob as exc:
            self._refused(who, fingerprint, study, "download", str(exc), exc.detail)
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such job: {exc}")
        except Denied as exc:
            self._refused(who, fingerprint, study, "download", target_of(body, study), str(exc))
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        self.audit.record(who, study, "download", record.id, "ok")
        yield from download.results_frames(self.deps, record, self.scratch)
