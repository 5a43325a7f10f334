"""The server's state: the Store interface its handlers use, and the one factory that opens it.

Everything the server must not lose lives in its store (jobs, each participant's state and its
changes, progress events, studies, the audit log); payloads and results live in the job's
folder. Two stores keep the same contract (tests/unit/server/test_store_contract.py runs
against both): SQLite (server/sqlite_store.py), what a server runs on, and memory
(server/memory_store.py), what the handlers' unit tests run on. ``open_store`` chooses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

FINISHED = ("FINISHED:COMPLETED", "FINISHED:FAILED", "FINISHED:ABORTED")


@dataclass
class JobRecord:
    id: str
    seq: int
    name: str
    study: str
    submitter: str
    submitter_org: str
    state: str
    reason: str
    meta: dict[str, Any]
    created: float
    updated: float
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def summary(self) -> dict[str, Any]:
        return {
            "job_id": self.id,
            "name": self.name,
            "study": self.study,
            "submitter": self.submitter,
            "state": self.state,
            "reason": self.reason,
            "created": self.created,
            "updated": self.updated,
            "parts": self.parts,
        }


class Store(Protocol):
    """The server's state. Every write bumps ``version``, so that watchers (``job status
    --wait``) wake on any change (``wait_for_change``)."""

    version: int

    def close(self) -> None: ...

    def wait_for_change(self, since: int, timeout: float) -> int:
        """Block until the store changed after version ``since`` (or timeout); the new one."""
        ...

    # -- jobs -----------------------------------------------------------------------------------
    def add_job(self, job_id: str, name: str, study: str, submitter: str, org: str,
                meta: dict[str, Any], participants: list[str]) -> None:
        """A SUBMITTED job (next in ``seq``) and a SUBMITTED part for each participant."""
        ...

    def set_job_state(self, job_id: str, state: str, reason: str = "") -> None: ...

    def set_part_state(self, job_id: str, participant: str, state: str,
                       reason: str = "") -> None:
        """The part's state now; a change of its state or reason is kept in its history."""
        ...

    def set_part_states(self, job_id: str, parts: dict[str, tuple[str, str]]) -> None:
        """``set_part_state`` for many parts at once (``{part: (state, reason)}``): one write
        for the 10,000 sites a job is dispatched to."""
        ...

    def part_history(self, job_id: str) -> list[dict[str, Any]]:
        """Every change of each part's state, in time order, from SUBMITTED at the job's
        intake: ``{"at", "part", "state", "reason"}``, ``at`` the server's time of the change."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def list_jobs(self, study: str | None = None, states: Iterable[str] | None = None,
                  limit: int = 1000, offset: int = 0) -> list[JobRecord]:
        """The newest first (``seq`` descending), each with its parts; ``offset`` skips that
        many first (a page of the dashboard's jobs list)."""
        ...

    def delete_job(self, job_id: str) -> None:
        """The job's record, parts, their history and events; the audit log keeps its
        entries."""
        ...

    def count_jobs(self, study: str) -> int: ...

    # -- progress events ------------------------------------------------------------------------
    def add_event(self, job_id: str, source: str, body: dict[str, Any]) -> None: ...

    def events(self, job_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        """In time order, after ``since``: ``{"at", "source", **body}``."""
        ...

    def recent_events(self, job_id: str) -> list[dict[str, Any]]: ...

    # -- participants and studies ---------------------------------------------------------------
    def upsert_participant(self, name: str, kind: str, org: str, role: str = "") -> None: ...

    def participants(self, kind: str | None = None) -> list[dict[str, str]]: ...

    def add_study(self, name: str) -> bool:
        """True if it was not there."""
        ...

    def remove_study(self, name: str) -> None: ...

    def studies(self) -> list[str]: ...

    def set_member(self, study: str, member: str, kind: str, present: bool) -> None: ...

    def members(self, study: str, kind: str) -> list[str]: ...

    # -- audit ----------------------------------------------------------------------------------
    def audit(self, user: str, org: str, role: str, study: str, action: str, target: str,
              outcome: str, detail: str = "") -> None: ...

    def audit_log(self, study: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The latest ``limit`` entries, oldest first."""
        ...


def open_store(path: Path | None) -> Store:
    """The server's store: SQLite at ``path``; in memory without one (tests, nothing kept)."""
    if path is None:
        from atoll.server.memory_store import MemoryStore

        return MemoryStore()
    from atoll.server.sqlite_store import SqliteStore

    return SqliteStore(path)


PROGRESS_SHOWN = 50


def recent_progress(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest events of a job: the workflow's own (rounds, the end) and the sites'
    (``fl.log_metrics``), up to PROGRESS_SHOWN of each, in time order, so that a site logging
    every batch cannot push the rounds out of what a watcher sees."""
    server = [e for e in events if e.get("source") == "server"][-PROGRESS_SHOWN:]
    others = [e for e in events if e.get("source") != "server"][-PROGRESS_SHOWN:]
    return sorted(server + others, key=lambda e: e.get("at", 0.0))
