"""The server's store in SQLite: one file in WAL mode, beside each job's folder on disk.

Writes are small and serialized through one connection and a lock, which SQLite in WAL mode
handles easily. The file and its -wal and -shm companions are the server's alone (0600).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from atoll.server.store import JobRecord, recent_progress

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL, name TEXT NOT NULL, study TEXT NOT NULL,
  submitter TEXT NOT NULL, submitter_org TEXT NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '', meta TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_study ON jobs (study, seq);
CREATE TABLE IF NOT EXISTS parts (
  job_id TEXT NOT NULL, participant TEXT NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '', updated REAL NOT NULL, PRIMARY KEY (job_id, participant)
);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL, at REAL NOT NULL, source TEXT NOT NULL, body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, at);
CREATE TABLE IF NOT EXISTS part_states (
  job_id TEXT NOT NULL, at REAL NOT NULL, participant TEXT NOT NULL, state TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS part_states_by_job ON part_states (job_id, at);
CREATE TABLE IF NOT EXISTS participants (
  name TEXT PRIMARY KEY, kind TEXT NOT NULL, org TEXT NOT NULL, role TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS studies (name TEXT PRIMARY KEY, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS study_members (
  study TEXT NOT NULL, member TEXT NOT NULL, kind TEXT NOT NULL, PRIMARY KEY (study, member, kind)
);
CREATE TABLE IF NOT EXISTS audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, user TEXT NOT NULL, org TEXT NOT NULL,
  role TEXT NOT NULL, study TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,
  outcome TEXT NOT NULL, detail TEXT NOT NULL DEFAULT ''
);
"""


class SqliteStore:
    """The Store (server/store.py) in one SQLite file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0600 before SQLite opens it, whatever the umask: SQLite makes the -wal and -shm files
        # with the database's own mode. One from an older atoll may be wider: narrowed here.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        for name in (path, *(path.with_name(path.name + end) for end in ("-wal", "-shm"))):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(name, 0o600)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        # Every write bumps `version`, so watchers (`job status --wait`) wake on any change.
        self.version = 0
        self._changed = threading.Condition()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _exec(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            cursor = self._db.execute(sql, tuple(args))
        self._bump()
        return cursor

    def _bump(self) -> None:
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def wait_for_change(self, since: int, timeout: float) -> int:
        """Block until the store changed after version `since` (or timeout); the new version."""
        with self._changed:
            self._changed.wait_for(lambda: self.version != since, timeout)
            return self.version

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def _tuples(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """_query's rows as plain tuples: a job's 10,000 parts read in a third of the time."""
        with self._lock:
            cursor = self._db.cursor()
            cursor.row_factory = None
            return cursor.execute(sql, tuple(args)).fetchall()

    # -- jobs -------------------------------------------------------------------------------
    def add_job(self, job_id: str, name: str, study: str, submitter: str, org: str,
                meta: dict[str, Any], participants: list[str]) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
                self._db.execute(
                    "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (job_id, seq, name, study, submitter, org, "SUBMITTED", "",
                     json.dumps(meta), now, now),
                )
                self._db.executemany(
                    "INSERT INTO parts VALUES (?,?,?,?,?)",
                    [(job_id, p, "SUBMITTED", "", now) for p in participants],
                )
                self._db.executemany(
                    "INSERT INTO part_states VALUES (?,?,?,?,?)",
                    [(job_id, now, p, "SUBMITTED", "") for p in participants],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        self._bump()

    def set_job_state(self, job_id: str, state: str, reason: str = "") -> None:
        self._exec("UPDATE jobs SET state=?, reason=?, updated=? WHERE id=?",
                   (state, reason, time.time(), job_id))

    def set_part_state(self, job_id: str, participant: str, state: str, reason: str = "") -> None:
        self.set_part_states(job_id, {participant: (state, reason)})

    def set_part_states(self, job_id: str, parts: dict[str, tuple[str, str]]) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if len(parts) == 1:
                    (name,) = parts
                    rows = self._db.execute(
                        "SELECT participant, state, reason FROM parts WHERE job_id=? AND "
                        "participant=?", (job_id, name)).fetchall()
                else:
                    rows = self._db.execute(
                        "SELECT participant, state, reason FROM parts WHERE job_id=?",
                        (job_id,)).fetchall()
                before = {r[0]: (r[1], r[2]) for r in rows}
                self._db.executemany(
                    "INSERT INTO parts VALUES (?,?,?,?,?) ON CONFLICT(job_id, participant) DO "
                    "UPDATE SET state=excluded.state, reason=excluded.reason, "
                    "updated=excluded.updated",
                    [(job_id, name, state, reason, now)
                     for name, (state, reason) in parts.items()])
                self._db.executemany(
                    "INSERT INTO part_states VALUES (?,?,?,?,?)",
                    [(job_id, now, name, state, reason) for name, (state, reason) in parts.items()
                     if before.get(name) != (state, reason)])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        self._bump()

    def part_history(self, job_id: str) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM part_states WHERE job_id=? ORDER BY at, rowid",
                           (job_id,))
        history = [{"at": r["at"], "part": r["participant"], "state": r["state"],
                    "reason": r["reason"]} for r in rows]
        # a job from before the store kept this: each part's state since its last change
        kept = {h["part"] for h in history}
        history += [{"at": p["updated"], "part": p["participant"], "state": p["state"],
                     "reason": p["reason"]}
                    for p in self._query("SELECT * FROM parts WHERE job_id=?", (job_id,))
                    if p["participant"] not in kept]
        return sorted(history, key=lambda h: h["at"])

    def get_job(self, job_id: str) -> JobRecord | None:
        rows = self._query("SELECT * FROM jobs WHERE id=?", (job_id,))
        if not rows:
            return None
        job = self._record(rows[0])
        parts = self._tuples("SELECT participant, state, reason FROM parts WHERE job_id=?",
                             (job_id,))
        job.parts = {name: {"state": state, "reason": reason} for name, state, reason in parts}
        return job

    def list_jobs(self, study: str | None = None, states: Iterable[str] | None = None,
                  limit: int = 1000, offset: int = 0) -> list[JobRecord]:
        sql, args = "SELECT * FROM jobs WHERE 1=1", []
        if study is not None:
            sql += " AND study=?"
            args.append(study)
        if states is not None:
            states = list(states)
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args.extend(states)
        sql += " ORDER BY seq DESC LIMIT ? OFFSET ?"
        args += [limit, max(0, offset)]
        jobs = [self._record(r) for r in self._query(sql, args)]
        if jobs:
            ids = [j.id for j in jobs]
            by_id = {j.id: j for j in jobs}
            for job_id, name, state, reason in self._tuples(
                "SELECT job_id, participant, state, reason FROM parts "
                f"WHERE job_id IN ({','.join('?' * len(ids))})", ids  # noqa: S608 - only ?s
            ):
                by_id[job_id].parts[name] = {"state": state, "reason": reason}
        return jobs

    def delete_job(self, job_id: str) -> None:
        """The job's rows (its record, parts, their history and events); the audit log keeps
        its entries."""
        with self._lock:
            for table, key in (("events", "job_id"), ("part_states", "job_id"),
                               ("parts", "job_id"), ("jobs", "id")):
                self._db.execute(f"DELETE FROM {table} WHERE {key}=?", (job_id,))  # noqa: S608
        self._bump()

    def count_jobs(self, study: str) -> int:
        return self._query("SELECT COUNT(*) FROM jobs WHERE study=?", (study,))[0][0]

    @staticmethod
    def _record(row: sqlite3.Row) -> JobRecord:
        return JobRecord(
            id=row["id"], seq=row["seq"], name=row["name"], study=row["study"],
            submitter=row["submitter"], submitter_org=row["submitter_org"], state=row["state"],
            reason=row["reason"], meta=json.loads(row["meta"]), created=row["created"],
            updated=row["updated"],
        )

    # -- progress events ----------------------------------------------------------------------
    def add_event(self, job_id: str, source: str, body: dict[str, Any]) -> None:
        self._exec("INSERT INTO events VALUES (?,?,?,?)",
                   (job_id, time.time(), source, json.dumps(body)))

    def events(self, job_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM events WHERE job_id=? AND at>? ORDER BY at",
                           (job_id, since))
        return [{"at": r["at"], "source": r["source"], **json.loads(r["body"])} for r in rows]

    def recent_events(self, job_id: str) -> list[dict[str, Any]]:
        """What a job's status shows: its latest events (``recent_progress``)."""
        return recent_progress(self.events(job_id))

    # -- participants and studies ---------------------------------------------------------------
    def upsert_participant(self, name: str, kind: str, org: str, role: str = "") -> None:
        self._exec(
            "INSERT INTO participants VALUES (?,?,?,?) ON CONFLICT(name) DO UPDATE "
            "SET kind=excluded.kind, org=excluded.org, role=excluded.role",
            (name, kind, org, role),
        )

    def participants(self, kind: str | None = None) -> list[dict[str, str]]:
        rows = (self._query("SELECT * FROM participants WHERE kind=? ORDER BY name", (kind,))
                if kind else self._query("SELECT * FROM participants ORDER BY name"))
        return [dict(r) for r in rows]

    def add_study(self, name: str) -> bool:
        cur = self._exec("INSERT OR IGNORE INTO studies VALUES (?,?)", (name, time.time()))
        return cur.rowcount == 1

    def remove_study(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM study_members WHERE study=?", (name,))
            self._db.execute("DELETE FROM studies WHERE name=?", (name,))

    def studies(self) -> list[str]:
        return [r["name"] for r in self._query("SELECT name FROM studies ORDER BY name")]

    def set_member(self, study: str, member: str, kind: str, present: bool) -> None:
        if present:
            self._exec("INSERT OR IGNORE INTO study_members VALUES (?,?,?)", (study, member, kind))
        else:
            self._exec("DELETE FROM study_members WHERE study=? AND member=? AND kind=?",
                       (study, member, kind))

    def members(self, study: str, kind: str) -> list[str]:
        rows = self._query(
            "SELECT member FROM study_members WHERE study=? AND kind=? ORDER BY member",
            (study, kind))
        return [r["member"] for r in rows]

    # -- audit ----------------------------------------------------------------------------------
    def audit(self, user: str, org: str, role: str, study: str, action: str, target: str,
              outcome: str, detail: str = "") -> None:
        self._exec(
            "INSERT INTO audit (at,user,org,role,study,action,target,outcome,detail) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            (time.time(), user, org, role, study, action, target, outcome, detail),
        )

    def audit_log(self, study: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        if study is None:
            rows = self._query("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = self._query("SELECT * FROM audit WHERE study=? ORDER BY id DESC LIMIT ?",
                               (study, limit))
        return [dict(r) for r in reversed(rows)]
