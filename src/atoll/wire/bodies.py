"""The JSON bodies peers send, one typed definition each with one parser.

Every body that crosses a gRPC call as text (a site's hello, heartbeat, job state and report; an
admin's call; a worker's report or finish note) is parsed here, once, into a frozen dataclass.
A parser refuses what the server or parent would otherwise meet half-checked: not JSON, not an
object, a job id out of its grammar, a capacity the scheduler cannot compare. Its refusal is a
`BodyError` (a ValueError) naming the body and the field; the servicer answers it
INVALID_ARGUMENT. The sender is untrusted: nothing here evaluates what it reads.

`doc` keeps the whole object for the one consumer that reads further keys of its own (a site's
hello: its authorization rules; a job state: its log tail), checked where that consumer uses
them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.spec.names import check_job_id
from atoll.spec.quantity import is_memory

MAX_RUNNING = 10_000  # job ids one hello or heartbeat may list
MAX_WORKER_BODY = 64 * 1024  # a worker's report or finish note: job code's text, kept and shown


class BodyError(AtollError, ValueError):
    """A body a peer sent is not of its definition; the message names the body and field."""

    exit_code = EXIT_INVALID


def json_object(text: str | None, what: str, max_bytes: int | None = None) -> dict[str, Any]:
    """A JSON object a peer sent (empty text is ``{}``); BodyError naming ``what`` otherwise."""
    text = text or "{}"
    if max_bytes is not None and len(text) > max_bytes:
        raise BodyError(f"{what} of {len(text)} bytes; at most {max_bytes} are taken")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise BodyError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise BodyError(f"{what} must be a JSON object")
    return value


def job_ids(value: Any, what: str) -> list[str]:
    """A site's list of running job ids: bounded, each of the job id grammar."""
    if not isinstance(value, list) or len(value) > MAX_RUNNING:
        raise BodyError(f"{what}'s running_jobs must be a list of at most {MAX_RUNNING:,} "
                        "job ids")
    return [check_job_id(j, f"{what}'s running_jobs entry") for j in value]


@dataclass(frozen=True)
class Hello:
    """A site's first message on its control stream. Its capacity goes to the scheduler, which
    must never meet a value it cannot compare."""

    running_jobs: list[str]
    capacity: dict[str, Any]
    launcher: str | None
    version: Any
    doc: dict[str, Any]

    @classmethod
    def parse(cls, text: str | None) -> Hello:
        doc = json_object(text, "hello")
        running = job_ids(doc.get("running_jobs", []), "hello")
        capacity = doc.get("capacity") or {}
        if not isinstance(capacity, dict):
            raise BodyError("hello's capacity must be a JSON object")
        for key in ("gpus", "cpus"):
            value = capacity.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise BodyError(f"hello's capacity.{key} must be a whole number of at least 0")
        if capacity.get("memory") is not None and not is_memory(capacity["memory"]):
            raise BodyError("hello's capacity.memory must be a size such as 512Gi")
        launcher = doc.get("launcher", "")
        if not isinstance(launcher, str | None):
            raise BodyError("hello's launcher must be a name")
        return cls(running, capacity, launcher, doc.get("version"), doc)


@dataclass(frozen=True)
class Heartbeat:
    """A site's periodic note on its control stream: the jobs it runs now."""

    running_jobs: list[str]

    @classmethod
    def parse(cls, text: str | None) -> Heartbeat:
        doc = json_object(text, "heartbeat")
        return cls(job_ids(doc.get("running_jobs", []), "heartbeat"))


@dataclass(frozen=True)
class JobState:
    """A site's state of one job: its job id of the grammar, its state a short name."""

    job_id: str
    state: str
    doc: dict[str, Any]

    @classmethod
    def parse(cls, text: str | None) -> JobState:
        doc = json_object(text, "job_state")
        job_id = check_job_id(doc.get("job_id"), "job_state's job_id")
        state = doc.get("state")
        if not isinstance(state, str) or not 0 < len(state) <= 64:
            raise BodyError("job_state's state must be a state name")
        return cls(job_id, state, doc)


@dataclass(frozen=True)
class SiteReport:
    """A site's progress event for a job it runs."""

    job_id: str
    event: dict[str, Any]

    @classmethod
    def parse(cls, text: str | None) -> SiteReport:
        doc = json_object(text, "the report")
        event = doc.get("event") or {}
        if not isinstance(event, dict):
            raise BodyError("the report's event must be a JSON object")
        return cls(check_job_id(doc.get("job_id"), "job_id"), event)


@dataclass(frozen=True)
class AdminCall:
    """An admin's call: the operation's name and the rest of its body, which the operation
    reads field by field (server/job_ops.py and its siblings)."""

    op: str
    doc: dict[str, Any]

    @classmethod
    def parse(cls, text: str | None) -> AdminCall:
        try:
            doc = json_object(text, "request body")
        except BodyError as exc:
            if "not JSON" in str(exc):
                raise
            doc = None
        if doc is None or not isinstance(doc.get("op", ""), str):
            raise BodyError('request body must be a JSON object such as {"op": "list_jobs"}')
        return cls(doc.get("op", ""), doc)


@dataclass(frozen=True)
class WorkerNote:
    """A worker's registration, report or finish note: an object of at most MAX_WORKER_BODY
    bytes (the worker runs the job's code: it is as trusted as that code)."""

    doc: dict[str, Any]

    @classmethod
    def parse(cls, text: str | None) -> WorkerNote:
        return cls(json_object(text, "body", MAX_WORKER_BODY))
