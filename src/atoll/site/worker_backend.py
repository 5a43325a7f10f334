"""What a site worker can do through its site parent: every call is relayed to the server.

Payloads pass through frame by frame; the parent never holds a whole task or reply in memory.
A worker on the parent's host (the process launcher) gets and sends them as files in the job's
handoff folder instead (wire/handoff.py): a task is written there as it arrives and handed over
once whole, and a reply is read from its file as it goes up to the server.

Every call of a worker is a sign of life for its stall watch (site/supervisor.py); while it
holds a task (from the task's hand-over to its reply) every call but its heartbeat, and every
frame of the task or reply moving, is a sign of progress too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from atoll.parent.worker_endpoint import BackendError
from atoll.site.task_stream import TaskCalls, TaskStream
from atoll.spec.errors import AtollError
from atoll.spec.names import IdentifierError, check_round, check_task_id, check_task_name
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.handoff import KEY, FileFrames, HandoffDir, payload_of

log = logging.getLogger("atoll.site.worker_backend")

SERVER_GONE_WAIT_S = 1.0  # between a worker's polls while the server cannot be reached

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher
    from atoll.site.privacy_ledger import SitePrivacyLedger
    from atoll.site.supervisor import SiteJob, StateReports


class SiteJobs(Protocol):
    """The jobs this site runs now (site/supervisor.py)."""

    def job(self, job_id: str) -> SiteJob | None: ...


class ServerCalls(TaskCalls, Protocol):
    """The calls a worker's traffic takes to the server (the parent's Federation stub)."""

    def Report(self, request: Any) -> Any: ...


class LauncherHost(Protocol):
    """The site parent's launcher, made at first use (site/app.py)."""

    @property
    def launcher(self) -> Launcher: ...


class SiteWorkerBackend:
    def __init__(self, site: str, jobs: SiteJobs, link: StateReports, server: ServerCalls,
                 host: LauncherHost, ledger: SitePrivacyLedger | None = None):
        self.site = site
        self.ledger = ledger  # the site's privacy spend per study (site/privacy_ledger.py)
        self.jobs = jobs
        self.link = link  # a worker's registration is its job's RUNNING
        self.server = server
        self.host = host  # whether workers share this host: tasks and replies go as files
        self._lock = threading.Lock()

    def _job(self, job_id: str, progress: bool = True) -> SiteJob:
        job = self.jobs.job(job_id)
        if job is None:
            raise BackendError(f"job {job_id} is not running at this site")
        if job.last_beat is not None:  # every call of its worker is a sign of life
            job.last_beat = time.monotonic()
        if progress:
            _progressed(job)
        return job

    def on_register(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        job.last_beat = time.monotonic()  # watched from now on (site/supervisor.py)
        self.link.send_state(job_id, "RUNNING", "worker connected")
        info: dict[str, Any] = {"site": self.site}
        if self.host.launcher.shares_host:
            if job.handoff is None:
                job.handoff = HandoffDir(job.workdir / "handoff", create=True)
            info["handoff"] = str(job.handoff.path)
        return info

    def app_zip(self, job_id: str) -> Path:
        path = self._job(job_id).app_zip
        if path is None:
            raise BackendError(f"job {job_id} has no app at this site yet")
        return path

    def next_task(self, job_id: str, wait_s: float, as_files: bool = False) -> Iterator[bytes]:
        job = self._job(job_id)
        job.progress = None  # it asks for work: it holds no task (a hand-over says it does)
        if job.ended.is_set():
            yield frames.header({"end": True})
            return
        try:
            stream = self._tasks(job).pull(min(max(wait_s, 0.0), 30.0))
            if as_files and job.handoff is not None:
                yield from _as_file(iter(stream), job.handoff, job)
            else:
                yield from _checked_stream(iter(stream), job)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                # the server is restarting: the worker waits it out (a job it resumes sends
                # its tasks again; one it does not is aborted here when the site reconnects)
                time.sleep(min(max(wait_s, 0.0), SERVER_GONE_WAIT_S))
                yield frames.header({"none": True})
                return
            raise BackendError(f"the server did not deliver the task: {exc.details()}") from None
        except IdentifierError as exc:  # the server's header, refused before the worker sees it
            raise BackendError(f"the server sent a task this site refuses: {exc}") from None
        except (frames.FrameError, OSError) as exc:  # a bad stream, or no room for its file
            raise BackendError(f"the task could not be handed over: {exc}") from None

    def send_reply(self, job_id: str, head: dict[str, Any], chunks: frames.Payload) -> dict:
        job = self._job(job_id)
        try:  # the worker runs the job's code: its ids are checked like the server's
            task_id = check_task_id(head.get("task_id"))
        except IdentifierError as exc:
            raise BackendError(f"the worker's reply is refused: {exc}") from None
        headers = head.get("headers") or {}
        if not isinstance(headers, dict):
            raise BackendError("the worker's reply headers must be a JSON object")
        upstream = {"job_id": job_id, "task_id": task_id, "headers": headers}
        data = payload_of(head, chunks, job.handoff)

        def relay() -> Iterator[bytes]:
            for frame in data:  # forwarded as received: no copy here
                _progressed(job)
                yield frame

        try:  # a handoff file's size is known: the server then needs no end marker
            size = data.size if isinstance(data, FileFrames) else None
            return self._tasks(job).reply(upstream, relay(), size)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:  # the server is restarting: a job
                log.warning("job %s: the server was unreachable; the reply to %s is lost (a "
                            "resumed job sends the task again)", job_id, task_id)
                return {"lost": True}
            raise BackendError(f"the server refused the reply: {exc.details()}") from None
        except frames.FrameError as exc:  # the worker's file or the server's answer
            raise BackendError(f"the reply did not go through: {exc}") from None
        finally:
            job.progress = None  # replied: it holds no task until the next hand-over

    def _tasks(self, job: SiteJob) -> TaskStream:
        """The job's task stream to the server, made at its first use."""
        with self._lock:
            if job.tasks is None:
                job.tasks = TaskStream(self.server, job.job_id)
            return job.tasks

    def send_task(self, job_id, head, chunks):
        raise BackendError("a site worker cannot send tasks; the server worker runs the workflow")

    def next_reply(self, job_id, task_id, wait_s, many=False, as_files=False):
        raise BackendError("a site worker receives tasks, not replies")

    def run_folder(self, job_id: str) -> Path:
        return self._job(job_id).workdir

    def keep_checkpoint(self, job_id, chunks):
        raise BackendError("a site worker keeps no checkpoint; the server worker does")

    def held_checkpoint(self, job_id):
        raise BackendError("a site worker keeps no checkpoint; the server worker does")

    def report(self, job_id: str, body: dict[str, Any]) -> None:
        beat = body == {"kind": "heartbeat"}  # life, not progress: its own thread sends it
        self._job(job_id, progress=not beat)
        if beat:  # for this parent alone (site/supervisor.py)
            return
        try:
            self.server.Report(msg.Json(body=json.dumps({"job_id": job_id, "event": body})))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:  # progress, lost while the server
                return  # restarts: the job itself goes on
            raise BackendError(f"the server did not take the report: {exc.details()}") from None

    def finish(self, job_id: str, ok: bool, error: str) -> None:
        self._job(job_id).report = (ok, error)

    def spend_budget(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Before a release: record the job's cumulative epsilon in its study's ledger, or
        refuse past the site's budget (the worker then sends nothing). The study is this
        parent's record of the job; the budget, the site's own files."""
        job = self._job(job_id)
        if self.ledger is None:
            raise BackendError(f"site {self.site} keeps no privacy ledger; nothing is released")
        kind, epsilon, delta = body.get("kind"), body.get("epsilon"), body.get("delta")
        if not isinstance(kind, str) or isinstance(epsilon, bool) or isinstance(delta, bool) \
                or not isinstance(epsilon, int | float) or not isinstance(delta, int | float):
            raise BackendError("a budget request needs kind (text), epsilon and delta (numbers)")
        try:
            total = self.ledger.spend(job.study, job_id, kind, float(epsilon), float(delta))
        except AtollError as exc:  # LedgerRefused, or the site's privacy.yaml unreadable
            raise BackendError(str(exc)) from None
        return {"total_epsilon": total}


def check_task_head(head: dict[str, Any]) -> dict[str, Any]:
    """The header of a task from the server, rebuilt from its checked fields: a task id and a
    task name of their grammars, headers a JSON object whose ``round`` is a round number; or
    exactly ``{"end": true}`` / ``{"none": true}``. IdentifierError (or FrameError) otherwise."""
    if "task_id" not in head:
        if head.get("end") is True:
            return {"end": True}
        if head.get("none") is True:
            return {"none": True}
        raise frames.FrameError("the server's task header names no task, end or none")
    headers = head.get("headers") or {}
    if not isinstance(headers, dict):
        raise frames.FrameError("the server's task headers are not a JSON object")
    check_round(headers.get("round"), "the task's round", optional=True)
    return {"task_id": check_task_id(head["task_id"], "the task's task_id"),
            "topic": check_task_name(head.get("topic"), "the task's topic"),
            "headers": headers}


def _checked_stream(stream: Iterator[bytes], job: SiteJob | None = None) -> Iterator[bytes]:
    """A task from the server as it goes to its worker over the link: its header checked."""
    first = next(stream, None)
    if first is None:
        raise frames.FrameError("the server sent an empty task stream")
    head = check_task_head(frames.read_header(first))
    _note_round(job, head)
    yield frames.header(head)
    yield from _moving(stream, job)


def _note_round(job: SiteJob | None, head: dict[str, Any]) -> None:
    """A task handed over: the job's part holds it from now (watched for progress), and the
    round it works on now, which a stall's reason names."""
    if job is None or "task_id" not in head:
        return
    job.progress = time.monotonic()
    if head["headers"].get("round") is not None:
        job.round = head["headers"]["round"]


def _progressed(job: SiteJob) -> None:
    if job.progress is not None:  # only while it holds a task
        job.progress = time.monotonic()


def _moving(stream: Iterator[bytes], job: SiteJob | None) -> Iterator[bytes]:
    """The frames of a task on their way to the worker: each is a sign of progress."""
    for frame in stream:
        if job is not None:
            _progressed(job)
        yield frame


def _as_file(stream: Iterator[bytes], folder: HandoffDir, job: SiteJob | None = None) -> Iterator[bytes]:
    """A task from the server as its worker takes it from the handoff folder: the data frames
    written to a new file as they arrive, then the header alone, naming the file."""
    first = next(stream, None)
    if first is None:
        raise frames.FrameError("the server sent an empty task stream")
    head = check_task_head(frames.read_header(first))
    _note_round(job, head)
    if "task_id" not in head:  # nothing to carry: "none" (no task yet) or "end"
        yield frames.header(head)
        return
    file = folder.create()
    try:
        file.write_frames(frames.Payload(_moving(stream, job)).frames())
    except BaseException:
        file.remove()
        raise
    yield frames.header({**head, KEY: file.hand_over()})
