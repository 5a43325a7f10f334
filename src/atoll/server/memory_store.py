"""The server's store in memory: the Store contract (server/store.py) with nothing kept.

What the handlers' unit tests run on: the same answers as SQLite (the contract suite,
tests/unit/server/test_store_contract.py, runs against both), no file, no process. Meta and
event bodies are kept as JSON text, as SQLite keeps them: what goes in must be JSON, and what
comes out is a fresh copy a caller may change.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from atoll.server.store import JobRecord, recent_progress


@dataclass
class _Job:
    seq: int
    name: str
    study: str
    submitter: str
    submitter_org: str
    state: str
    reason: str
    meta: str
    created: float
    updated: float
    parts: dict[str, tuple[str, str]] = field(default_factory=dict)  # name: (state, reason)


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._events: list[tuple[str, float, str, str]] = []  # job, at, source, body
        self._history: list[tuple[str, float, str, str, str]] = []  # job, at, part, state, reason
        self._participants: dict[str, dict[str, str]] = {}
        self._studies: dict[str, float] = {}
        self._members: set[tuple[str, str, str]] = set()  # study, member, kind
        self._audit: list[dict[str, Any]] = []
        self.version = 0
        self._changed = threading.Condition()

    def close(self) -> None:
        pass

    def _bump(self) -> None:
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def wait_for_change(self, since: int, timeout: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self.version != since, timeout)
            return self.version

    # -- jobs -----------------------------------------------------------------------------------
    def add_job(self, job_id: str, name: str, study: str, submitter: str, org: str,
                meta: dict[str, Any], participants: list[str]) -> None:
        now, text = time.time(), json.dumps(meta)
        with self._lock:
            if job_id in self._jobs:
                raise ValueError(f"job {job_id} is already in the store")
            seq = max((j.seq for j in self._jobs.values()), default=0) + 1
            self._jobs[job_id] = _Job(seq, name, study, submitter, org, "SUBMITTED", "", text,
                                      now, now, {p: ("SUBMITTED", "") for p in participants})
            self._history += [(job_id, now, p, "SUBMITTED", "") for p in participants]
        self._bump()

    def set_job_state(self, job_id: str, state: str, reason: str = "") -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                job.state, job.reason, job.updated = state, reason, time.time()
        self._bump()

    def set_part_state(self, job_id: str, participant: str, state: str, reason: str = "") -> None:
        self.set_part_states(job_id, {participant: (state, reason)})

    def set_part_states(self, job_id: str, parts: dict[str, tuple[str, str]]) -> None:
        now = time.time()
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                for participant, (state, reason) in parts.items():
                    if job.parts.get(participant) != (state, reason):
                        self._history.append((job_id, now, participant, state, reason))
                    job.parts[participant] = (state, reason)
        self._bump()

    def part_history(self, job_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = [h for h in self._history if h[0] == job_id]
        return [{"at": at, "part": part, "state": state, "reason": reason}
                for _, at, part, state, reason in sorted(rows, key=lambda h: h[1])]

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else _record(job_id, job)

    def list_jobs(self, study: str | None = None, states: Iterable[str] | None = None,
                  limit: int = 1000, offset: int = 0) -> list[JobRecord]:
        wanted = None if states is None else set(states)
        with self._lock:
            chosen = [(i, j) for i, j in self._jobs.items()
                      if (study is None or j.study == study)
                      and (wanted is None or j.state in wanted)]
            chosen.sort(key=lambda item: item[1].seq, reverse=True)
            return [_record(i, j) for i, j in _limited(chosen[max(0, offset):], limit)]

    def delete_job(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
            self._events = [e for e in self._events if e[0] != job_id]
            self._history = [h for h in self._history if h[0] != job_id]
        self._bump()

    def count_jobs(self, study: str) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.study == study)

    # -- progress events ------------------------------------------------------------------------
    def add_event(self, job_id: str, source: str, body: dict[str, Any]) -> None:
        text = json.dumps(body)
        with self._lock:
            self._events.append((job_id, time.time(), source, text))
        self._bump()

    def events(self, job_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            rows = sorted((e for e in self._events if e[0] == job_id and e[1] > since),
                          key=lambda e: e[1])
        return [{"at": at, "source": source, **json.loads(body)} for _, at, source, body in rows]

    def recent_events(self, job_id: str) -> list[dict[str, Any]]:
        return recent_progress(self.events(job_id))

    # -- participants and studies ---------------------------------------------------------------
    def upsert_participant(self, name: str, kind: str, org: str, role: str = "") -> None:
        with self._lock:
            self._participants[name] = {"name": name, "kind": kind, "org": org, "role": role}
        self._bump()

    def participants(self, kind: str | None = None) -> list[dict[str, str]]:
        with self._lock:
            return [dict(p) for _, p in sorted(self._participants.items())
                    if not kind or p["kind"] == kind]

    def add_study(self, name: str) -> bool:
        with self._lock:
            added = name not in self._studies
            self._studies.setdefault(name, time.time())
        self._bump()
        return added

    def remove_study(self, name: str) -> None:
        with self._lock:
            self._members = {m for m in self._members if m[0] != name}
            self._studies.pop(name, None)

    def studies(self) -> list[str]:
        with self._lock:
            return sorted(self._studies)

    def set_member(self, study: str, member: str, kind: str, present: bool) -> None:
        with self._lock:
            if present:
                self._members.add((study, member, kind))
            else:
                self._members.discard((study, member, kind))
        self._bump()

    def members(self, study: str, kind: str) -> list[str]:
        with self._lock:
            return sorted(m for s, m, k in self._members if s == study and k == kind)

    # -- audit ----------------------------------------------------------------------------------
    def audit(self, user: str, org: str, role: str, study: str, action: str, target: str,
              outcome: str, detail: str = "") -> None:
        with self._lock:
            self._audit.append({"id": len(self._audit) + 1, "at": time.time(), "user": user,
                                "org": org, "role": role, "study": study, "action": action,
                                "target": target, "outcome": outcome, "detail": detail})
        self._bump()

    def audit_log(self, study: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        with self._lock:
            rows = [e for e in self._audit if study is None or e["study"] == study]
            return [dict(e) for e in reversed(_limited(rows[::-1], limit))]


def _limited(rows: list, limit: int) -> list:
    """The first ``limit`` rows, as SQLite's LIMIT: a negative one is no limit."""
    return rows if limit < 0 else rows[:limit]


def _record(job_id: str, job: _Job) -> JobRecord:
    return JobRecord(
        id=job_id, seq=job.seq, name=job.name, study=job.study, submitter=job.submitter,
        submitter_org=job.submitter_org, state=job.state, reason=job.reason,
        meta=json.loads(job.meta), created=job.created, updated=job.updated,
        parts={p: {"state": s, "reason": r} for p, (s, r) in job.parts.items()})
