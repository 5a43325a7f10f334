"""The two channels a job's workers talk through; the federation carries them.

A server worker runs the workflow and talks to the job's sites through a ``ServerChannel``; a
site worker runs the training script and talks to the server worker through a ``SiteChannel``.
Payloads are iterables of byte chunks, never one big buffer: the federation streams them through
both parents without holding a whole payload, and the receiver pulls.

Two implementations exist: the gRPC one in ``atoll.worker.grpc_channels`` (through the parents),
and the in-memory one in ``atoll.fl.simulator`` (threads and queues, for tests and local runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

Chunk = bytes | bytearray | memoryview


@dataclass
class Task:
    """A unit of work the server worker sent to one site."""

    task_id: str
    topic: str  # e.g. "train", "validate"
    headers: dict[str, Any]  # JSON-safe metadata (round number, model meta, ...)
    chunks: Iterator[bytes]  # the payload; consume it once, in order


@dataclass
class Reply:
    """One site's answer to a task, or the news that it will never answer."""

    site: str
    headers: dict[str, Any] = field(default_factory=dict)
    chunks: Iterator[bytes] | None = None  # None when error is set
    error: str | None = None  # e.g. "site-1 dropped out: worker killed by signal 9"
    # The site's part restarted (its site parent came back, or a stalled worker was replaced):
    # it is back and takes the task again if it is sent again (rounds.gather does).
    retry: bool = False


class ServerChannel(Protocol):
    job_id: str
    sites: list[str]  # the job's sites, in a stable order
    results_dir: Path  # what the workflow writes here becomes the job's downloadable result
    # optional: ``checkpoint_dir`` (a Path), where the workflow's checkpoints go so that the job
    # survives a server restart (atoll.fl.checkpoint); a channel without one keeps none; and
    # ``checkpoint_committed(round)``, called once each is committed, before it is reported
    # (a worker whose run folder goes with it sends it to its parent: wire/checkpoint_home.py)

    def send(
        self, targets: Sequence[str], topic: str, headers: dict[str, Any], payload: Iterable[Chunk]
    ) -> str:
        """Send one payload to several sites (uploaded once); returns the task id."""
        ...

    def replies(self, task_id: str, timeout: float | None = None) -> Iterator[Reply]:
        """Yield replies as they arrive until every target answered or dropped, or timeout.
        Read a reply's chunks before taking the next: replies may share one stream."""
        ...

    def report(self, event: dict[str, Any]) -> None:
        """Progress for the job's status and logs (round, per-site metrics); JSON-safe."""
        ...


class SiteChannel(Protocol):
    job_id: str
    site: str

    def receive(self, timeout: float | None = None) -> Task | None:
        """The next task for this site; None once the job is over."""
        ...

    def reply(self, task_id: str, headers: dict[str, Any], payload: Iterable[Chunk]) -> None:
        ...

    def report(self, event: dict[str, Any]) -> None:
        ...

    def spend_budget(self, kind: str, epsilon: float, delta: float) -> float:
        """Ask the site's privacy ledger (in the site parent) before a release: the job's
        cumulative ``epsilon`` for ``kind`` at ``delta``; the study's total epsilon, or
        BudgetExhausted (atoll.fl.privacy.accounting) naming the ledger."""
        ...
