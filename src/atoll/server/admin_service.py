"""The Admin service: what admins call (CLI, Session), scoped to one study per call.

Each call's study is the one the caller's signed session token names, or a one-off `study` in
the request; membership is checked on every call. A job of another study answers exactly like
a job that does not exist.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc

from atoll.pki.identity import Identity
from atoll.server.auth import peer_identity
from atoll.server.jobs import job_summary
from atoll.server.store import JobRecord
from atoll.server.studies import DEFAULT, SUBMIT_ROLES, Denied
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.jobzip import IntakeError, add_file

log = logging.getLogger("atoll.server.admin")
LOG_TAIL_BYTES = 256 * 1024
MAX_WAIT_S = 20.0  # a status long-poll answers at least this often


class NoSuchJob(Exception):
    pass


class AdminService:
    def __init__(self, parent):
        self.parent = parent
        self.ops = {
            "login": self.login, "whoami": self.whoami, "list_jobs": self.list_jobs,
            "job_status": self.job_status, "job_logs": self.job_logs, "abort_job": self.abort_job,
            "list_sites": self.list_sites, "audit": self.audit_log,
        }
        self.ops.update(parent.study_ops())

    # -- plumbing ------------------------------------------------------------------------------
    def _scope(self, context, body: dict[str, Any]) -> tuple[Identity, str]:
        who = peer_identity(context, "admin")
        self.parent.studies.remember_user(who)
        study = body.get("study")
        if not study:
            token = dict(context.invocation_metadata()).get("x-atoll-session", "")
            study = self.parent.signer.verify(token, who.name) if token else None
            if token and study is None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              "your session expired or is not yours; run `atoll login` again")
        return who, study or DEFAULT

    def Call(self, request, context):
        try:
            body = json.loads(request.body or "{}")
        except ValueError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request body is not JSON")
        op = self.ops.get(body.get("op"))
        if op is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown operation {body.get('op')!r}")
        who, study = self._scope(context, body)
        try:
            if body.get("op") != "login":
                self.parent.studies.require_member(who, study)
            return msg.Json(body=json.dumps(op(who, study, body)))
        except NoSuchJob as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such job: {exc}")
        except Denied as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def _job(self, study: str, job_id: Any) -> JobRecord:
        record = self.parent.store.get_job(str(job_id))
        if record is None or record.study != study:
            raise NoSuchJob(str(job_id))
        return record

    def _audit(self, who: Identity, study: str, action: str, target: str, outcome: str,
               detail: str = "") -> None:
        self.parent.store.audit(who.name, who.org, who.role or "", study, action, target, outcome,
                                detail)

    @staticmethod
    def _may_manage(who: Identity, record: JobRecord) -> bool:
        if who.role == "project_admin" or who.name == record.submitter:
            return True
        return who.role == "org_admin" and who.org == record.submitter_org

    # -- operations ----------------------------------------------------------------------------
    def login(self, who, study, body):
        try:
            self.parent.studies.require_member(who, study)
        except Denied:
            self._audit(who, study, "login", study, "refused")
            raise
        self._audit(who, study, "login", study, "ok")
        return {"token": self.parent.signer.issue(who.name, study), "study": study,
                "user": who.name, "org": who.org, "role": who.role}

    def whoami(self, who, study, body):
        return {"user": who.name, "org": who.org, "role": who.role, "study": study,
                "studies": self.parent.studies.visible(who)}

    def list_jobs(self, who, study, body):
        return {"jobs": [job_summary(r) for r in self.parent.store.list_jobs(study=study)]}

    def job_status(self, who, study, body):
        """A job's status. With `since` (the `version` of an earlier answer) and `wait_s`, it
        first waits up to wait_s for anything to change: watchers need no polling loop."""
        since, wait_s = body.get("since"), float(body.get("wait_s") or 0)
        record = self._job(study, body.get("job_id"))
        if isinstance(since, int) and wait_s > 0 and not record.finished:
            self.parent.store.wait_for_change(since, min(wait_s, MAX_WAIT_S))
        version = self.parent.store.version  # read before the record: never miss a change
        record = self._job(study, record.id)
        out = job_summary(record)
        out["version"] = version
        out["progress"] = self.parent.store.events(record.id)[-50:]
        return out

    def job_logs(self, who, study, body):
        record = self._job(study, body.get("job_id"))
        folder = self.parent.jobs.jobs_dir / record.id
        logs = {}
        server_log = folder / "run" / "server" / "logs" / "worker.log"
        for name, path in [("server", server_log), *sorted(
                (p.stem, p) for p in (folder / "logs").glob("*.log"))]:
            if path.exists():
                with open(path, "rb") as fh:
                    fh.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                    logs[name] = fh.read().decode("utf-8", "replace")
        return {"job_id": record.id, "logs": logs, "events": self.parent.store.events(record.id)}

    def abort_job(self, who, study, body):
        record = self._job(study, body.get("job_id"))
        if not self._may_manage(who, record):
            self._audit(who, study, "abort", record.id, "refused")
            raise Denied(f"{who.name} ({who.role}) may not abort {record.submitter}'s job")
        self.parent.jobs.abort(record.id, f"aborted by {who.name}")
        self._audit(who, study, "abort", record.id, "ok")
        return job_summary(self.parent.store.get_job(record.id))

    def list_sites(self, who, study, body):
        online = self.parent.links.online()
        sites = []
        for name in self.parent.studies.sites(study):
            link = online.get(name)
            sites.append({"name": name, "online": link is not None,
                          "launcher": link.hello.get("launcher") if link else None,
                          "capacity": link.capacity if link else None,
                          "running_jobs": len(link.running_jobs) if link else 0})
        return {"study": study, "sites": sites}

    def audit_log(self, who, study, body):
        if who.role != "project_admin":
            raise Denied("only project admins may read the audit log")
        only = body.get("only_study")
        return {"entries": self.parent.store.audit_log(study=only, limit=int(body.get("limit",
                                                                                       1000)))}

    # -- streams -------------------------------------------------------------------------------
    def Submit(self, request_iterator, context):
        try:
            head, chunks = frames.split(request_iterator)
        except frames.FrameError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        who, study = self._scope(context, head)
        try:
            self.parent.studies.require_member(who, study)
            if who.role not in SUBMIT_ROLES:
                raise Denied(f"{who.name} is a {who.role}; submitting jobs needs one of "
                             f"{', '.join(SUBMIT_ROLES)}")
            record = self.parent.jobs.submit(who, study, chunks)
        except Denied as exc:
            self._audit(who, study, "submit", "-", "refused", str(exc))
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except (IntakeError, frames.FrameError) as exc:
            self._audit(who, study, "submit", "-", "refused", str(exc)[:500])
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._audit(who, study, "submit", record.id, "ok")
        return msg.Json(body=json.dumps(job_summary(record)))

    def Download(self, request, context):
        import tempfile  # with zipfile: when results are fetched, not in a parent at rest
        import zipfile

        body = json.loads(request.body or "{}")
        who, study = self._scope(context, body)
        try:
            self.parent.studies.require_member(who, study)
            record = self._job(study, body.get("job_id"))
            if not self._may_manage(who, record):
                raise Denied(f"{who.name} ({who.role}) may not download {record.submitter}'s job")
        except NoSuchJob as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no such job: {exc}")
        except Denied as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        self._audit(who, study, "download", record.id, "ok")
        folder = self.parent.jobs.jobs_dir / record.id
        with tempfile.TemporaryDirectory(dir=self.parent.workspace / "tmp") as tmp:
            out = Path(tmp) / "results.zip"
            with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
                for base, prefix in [(folder / "run" / "server" / "results", "results"),
                                     (folder / "logs", "logs"),
                                     (folder / "run" / "server" / "logs", "logs/server")]:
                    for path in sorted(base.rglob("*")) if base.exists() else []:
                        if path.is_file() and not path.is_symlink():
                            add_file(archive, path,
                                     f"{prefix}/{path.relative_to(base).as_posix()}")
                archive.writestr("job.json", json.dumps(job_summary(record), indent=2))
            yield frames.header({"job_id": record.id, "size": out.stat().st_size})
            for chunk in frames.file_chunks(out):
                yield frames.data(chunk)
