"""A job the server runs now, as the server's parts see it: its record, meta, sites, relay and
folder, the server worker's handle and report, and each part's end.

`RunningJobs` is what the server worker's backend (server/worker_backend.py) may ask of the jobs:
the live job by id, the one place a part becomes RUNNING (server/lifecycle.py), the app's zip
and the revocation list held now. It never reaches into the job manager's own table.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from atoll.server.relay import JobRelay
from atoll.server.store import JobRecord

if TYPE_CHECKING:
    from atoll.launchers.base import Handle
    from atoll.pki.revocation import RevocationList
    from atoll.spec.meta_plain import Meta
    from atoll.spec.resources import Resources


@dataclass
class LiveJob:
    record: JobRecord
    meta: Meta  # validated at intake; it went with the job to the scheduler and here
    sites: list[str]
    relay: JobRelay
    folder: Path
    handle: Handle | None = None
    report: tuple[bool, str] | None = None  # the server worker's own Finish report
    server_state: str | None = None
    server_reason: str = ""
    aborting: str | None = None
    site_states: dict[str, tuple[str, str]] = field(default_factory=dict)
    resources: dict[str, Resources] = field(default_factory=dict)
    # sites whose parent disconnected: the timer that fails their part unless it comes back
    away: dict[str, threading.Timer] = field(default_factory=dict)
    resumes: int = 0  # server restarts this job was resumed after (server/lifecycle.py)
    resume_round: int = 0  # the round its last checkpoint committed, when it was resumed

    def __post_init__(self) -> None:
        self.members = frozenset(self.sites)  # `site in live.sites` on every relay call

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def resume_note(self) -> str:
        """What `atoll job status` says of a job a server restart interrupted ("" if none)."""
        if not self.resumes:
            return ""
        if not self.resume_round:
            return "restarted from round 1 after a server restart (no round had completed)"
        return f"resumed at round {self.resume_round + 1} after a server restart"


class HeldRevocations(Protocol):
    """The revocation list the server holds now (server/revocation.py)."""

    @property
    def current(self) -> RevocationList: ...


class RunningJobs(Protocol):
    """The jobs as the server worker's backend sees them (server/jobs.py implements it)."""

    revocations: HeldRevocations

    def running(self, job_id: str) -> LiveJob | None: ...

    def part_running(self, live: LiveJob, part: str, reason: str = "") -> None: ...

    def app_zip(self, job_id: str, target: str) -> Path: ...
