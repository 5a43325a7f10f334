"""The admin operations on one study's jobs and sites, as plain functions.

Each takes what it works on (``JobOps``: the store, the studies, the jobs, the links, the sites'
policies and the audit log), the caller, the call's study and the request body, and returns the
answer as JSON-able values; it raises NoSuchJob, Denied or ValueError, which the Admin service
(server/admin_service.py) maps to status codes and audits. A job of another study is NoSuchJob,
exactly like one that does not exist.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.launchers.job_files import JobFileError, read_tail
from atoll.server.jobs import job_summary
from atoll.server.studies import Denied
from atoll.spec.errors import EXIT_NOT_FOUND, AtollError

if TYPE_CHECKING:
    from atoll.pki.identity import Identity
    from atoll.server.audit import Audit
    from atoll.server.site_links import SiteLinks
    from atoll.server.site_policies import SitePolicies
    from atoll.server.store import JobRecord, Store
    from atoll.server.studies import Members

LOG_TAIL_BYTES = 256 * 1024

# An operation: (caller, study, request body) -> the answer, as JSON-able values.
Op = Callable[["Identity", str, dict[str, Any]], Any]


class NoSuchJob(AtollError):
    exit_code = EXIT_NOT_FOUND

    def __init__(self, job_id: str, detail: str = "no such job"):
        super().__init__(job_id)
        self.detail = detail  # for the audit log only: the caller learns nothing more


class AdminJobs(Protocol):
    """What admins do to jobs (server/jobs.py): their folders, intake and abort."""

    @property
    def jobs_dir(self) -> Path: ...

    def submit(self, who: Identity, study: str, chunks: Iterator[bytes]) -> JobRecord: ...

    def abort(self, job_id: str, reason: str) -> None: ...


class StatusCache:
    """Each job's last status, with the store version read before it. While the store has not
    changed since, a status call is answered from it: reading a job of 10,000 parts takes 30 ms,
    and dashboards and scripts ask again and again while a round runs and nothing changes."""

    SIZE = 64  # jobs

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: OrderedDict[str, tuple[int, str, dict[str, Any]]] = OrderedDict()

    def get(self, job_id: str, version: int) -> tuple[str, dict[str, Any]] | None:
        """(the job's study, a copy of its status) if read at this version."""
        with self._lock:
            found = self._by_job.get(job_id)
            if found is None or found[0] != version:
                return None
            self._by_job.move_to_end(job_id)
        return found[1], dict(found[2])

    def put(self, job_id: str, version: int, study: str, status: dict[str, Any]) -> None:
        with self._lock:
            self._by_job[job_id] = (version, study, dict(status))
            self._by_job.move_to_end(job_id)
            while len(self._by_job) > self.SIZE:
                self._by_job.popitem(last=False)


@dataclass(frozen=True)
class JobOps:
    store: Store
    studies: Members
    jobs: AdminJobs
    links: SiteLinks
    policies: SitePolicies
    audit: Audit
    statuses: StatusCache = field(default_factory=StatusCache)


def ops(deps: JobOps) -> dict[str, Op]:
    """The operations by name, bound to ``deps``."""
    return {name: partial(fn, deps) for name, fn in (
        ("list_jobs", list_jobs), ("job_status", job_status), ("job_logs", job_logs),
        ("abort_job", abort_job), ("delete_job", delete_job), ("list_sites", list_sites),
        ("audit", audit_log))}


# -- the rules every operation on a job follows ------------------------------------------------


def find_job(deps: JobOps, study: str, job_id: Any) -> JobRecord:
    """The job, if it is in ``study``; NoSuchJob otherwise (the audit log hears which)."""
    record = deps.store.get_job(str(job_id))
    if record is None:
        raise NoSuchJob(str(job_id))
    if record.study != study:
        raise NoSuchJob(str(job_id), f"the job is in study {record.study}")
    return record


def may_manage(who: Identity, record: JobRecord) -> bool:
    if who.role == "project_admin" or who.name == record.submitter:
        return True
    return who.role == "org_admin" and who.org == record.submitter_org


def require_manager(deps: JobOps, who: Identity, record: JobRecord, right: str,
                    verb: str) -> None:
    """Denied unless ``who`` may manage the job (its submitter, their org admin, a project
    admin) and no site of the job refuses ``right`` to them by its own policy
    (server/site_policies.py): a site can only narrow what the roles allow."""
    if not may_manage(who, record):
        raise Denied(f"{who.name} ({who.role}) may not {verb} {record.submitter}'s job")
    why = deps.policies.refusal(who, record, right)
    if why is not None:
        raise Denied(f"{who.name} ({who.role}) may not {verb} {record.submitter}'s job: {why}")


# -- the operations ---------------------------------------------------------------------------


MAX_PAGE = 500  # jobs in one page of `list_jobs` with `offset` (the dashboard's list)


def list_jobs(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    """The study's jobs, newest first; with ``offset`` (and ``limit``) one page of them, with
    the study's total and each waiting job's place in the study's queue (1: next)."""
    if "offset" not in body:
        return {"jobs": [job_summary(r) for r in deps.store.list_jobs(study=study)]}
    offset, limit = body.get("offset"), body.get("limit", 50)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for v in (offset, limit)):
        raise ValueError("offset and limit must be counts of jobs")
    jobs = [job_summary(r) for r in deps.store.list_jobs(study=study, limit=min(limit, MAX_PAGE),
                                                         offset=offset)]
    if any(j["state"] == "SUBMITTED" for j in jobs):
        # the scheduler's order: oldest first (server/scheduler.py)
        queue = deps.store.list_jobs(study=study, states=["SUBMITTED"], limit=-1)[::-1]
        place = {r.id: n for n, r in enumerate(queue, 1)}
        for job in jobs:
            if job["job_id"] in place:
                job["queue_position"] = place[job["job_id"]]
    return {"jobs": jobs, "total": deps.store.count_jobs(study), "offset": offset}


def unfinished(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> bool:
    """Whether a status call may wait: the job can still change."""
    return not find_job(deps, study, body.get("job_id")).finished


def job_status(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    """A job's status, with the store's ``version`` (read first: never miss a change) that a
    watcher passes back as ``since`` to wait for the next one."""
    version = deps.store.version
    cached = deps.statuses.get(str(body.get("job_id")), version)
    if cached is not None and cached[0] == study:  # else find_job says why not
        return cached[1]
    record = find_job(deps, study, body.get("job_id"))
    out = job_summary(record)
    out["version"] = version
    out["progress"] = deps.store.recent_events(record.id)
    deps.statuses.put(record.id, version, record.study, out)
    return out


def job_logs(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    """A job's record so far: its logs' tails, all its events, and every change of each
    part's state with the server's time of it (the dashboard's states over time)."""
    record = find_job(deps, study, body.get("job_id"))
    folder = deps.jobs.jobs_dir / record.id
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
    return {"job_id": record.id, "logs": logs, "events": deps.store.events(record.id),
            "part_history": deps.store.part_history(record.id)}


def abort_job(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    record = find_job(deps, study, body.get("job_id"))
    require_manager(deps, who, record, "manage_job", "abort")  # a refusal is audited by the caller
    deps.jobs.abort(record.id, f"aborted by {who.name}")
    deps.audit.record(who, study, "abort", record.id, "ok")
    return job_summary(deps.store.get_job(record.id))


def delete_job(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    """A finished job, gone: its record, progress and results folder. The audit log keeps
    who submitted and who deleted it. A study without jobs can then be removed."""
    import shutil  # with the first delete, not at rest

    record = find_job(deps, study, body.get("job_id"))
    require_manager(deps, who, record, "manage_job", "delete")
    if not record.finished:
        raise ValueError(f"job {record.id} is {record.state}; abort it first "
                         f"(`atoll job abort {record.id}`)")
    deps.store.delete_job(record.id)
    shutil.rmtree(deps.jobs.jobs_dir / record.id, ignore_errors=True)
    for site in record.parts:  # each online site removes its run folder (retention: the rest)
        if site != "server":
            deps.links.send(site, "forget", {"job_id": record.id})
    deps.audit.record(who, study, "delete", record.id, "ok", f"name={record.name!r} "
                      f"submitter={record.submitter} state={record.state}")
    return {"deleted": record.id, "name": record.name}


def list_sites(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    """The study's sites: online or not, and for those online their launcher, capacity, atoll
    version, seconds since their last heartbeat, and what holds them: this study's unfinished
    jobs by id, other studies' only counted (as ``running_jobs`` always counted them)."""
    import time

    online = deps.links.online()
    sites = []
    for name in deps.studies.sites(study):
        link = online.get(name)
        entry = {"name": name, "online": link is not None,
                 "launcher": link.hello.get("launcher") if link else None,
                 "capacity": link.capacity if link else None,
                 "running_jobs": len(link.running_jobs) if link else 0}
        if link is not None:
            ours, others = [], 0
            for job_id in link.running_jobs:  # as the site last said: a job just ended may linger
                record = deps.store.get_job(str(job_id))
                if record is None or record.study != study:
                    others += 1
                elif not record.finished:
                    ours.append(record.id)
            version = link.hello.get("version")
            entry.update(version=version if isinstance(version, str) else None,
                         heartbeat_s_ago=round(max(0.0, time.monotonic() - link.last_seen), 1),
                         study_jobs=ours, other_study_jobs=others)
        sites.append(entry)
    return {"study": study, "sites": sites}


def audit_log(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    if who.role != "project_admin":
        raise Denied("only project admins may read the audit log")
    only, limit = body.get("only_study"), body.get("limit", 1000)
    if not isinstance(only, str | None) or not isinstance(limit, int):
        raise ValueError("only_study must be a study's name and limit a number of entries")
    return {"entries": deps.store.audit_log(study=only, limit=limit)}
