"""The server-side relay of one running job: tasks for sites and their replies.

Each payload is a Spool (server/spool.py): a task reaches the sites that are waiting for it as
it arrives, without touching the disk; a reply reaches the workflow once complete. Memory is
bounded by the server's budget, the rest spills to the job's folder. A site that drops out gets
an error reply on each task it still owed, so the workflow never waits on a site that cannot
answer.
A site whose part restarts mid-round (its site parent restarted, or its stalled worker was
replaced) gets a *retry* error on each task its old part took and did not answer (`requeue`):
the workflow sends that task to it again (fl/workflows/rounds.py), rather than the relay
keeping every task's frames for a replay.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll.base.files import private_dir
from atoll.server.spool import Budget, SpillFiles, Spool
from atoll.server.waiters import AsyncWaiters, until
from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.wire.handoff import HandoffDir

END = object()  # returned by wait_task once the job is over
SMALL_REPLY = 64 * 1024  # held in memory until whole (ReplyWriter)


@dataclass
class TaskEntry:
    task_id: str
    topic: str
    headers: dict[str, Any]
    spool: Spool
    targets: set[str]
    replied: set[str] = field(default_factory=set)
    # sites whose part restarted while their reply was on its way in: if that reply breaks
    # off, the task is owed a retry error rather than a second reply from the old part
    restarted: set[str] = field(default_factory=set)
    # the last compact message built for it, with the ack it carries (federation_service.py)
    compact: tuple[dict[str, Any], bytes] | None = None


@dataclass
class ReplyEntry:
    task_id: str
    site: str
    headers: dict[str, Any]
    spool: Spool | None
    error: str | None = None
    retry: bool = False  # the site's part restarted: the workflow may send the task again


_OLD_TASK = re.compile(r"(r[0-9]+)?t[0-9]+")  # the task ids a relay of this job gave out


class RelayError(AtollError):
    exit_code = EXIT_INVALID


class JobRelay:
    def __init__(self, job_id: str, folder: Path, sites: Iterable[str], budget: Budget,
                 max_payload: int | None = None, handoff: bool = False, attempt: int = 0):
        self.job_id = job_id
        # task ids of a job resumed after a server restart differ from the interrupted run's
        # ("r1t5", not "t5"): a site's late reply to an old task can never match a new one
        self.prefix = f"r{attempt}t" if attempt else "t"
        self.folder = folder
        private_dir(folder)
        # For a server worker on this host: replies go whole into files here, and its tasks
        # come in as files here (wire/handoff.py). Set before that worker starts (share_files).
        self.handoff: HandoffDir | None = None
        if handoff:
            self.share_files()
        self.sites = list(sites)
        self.max_payload = max_payload
        self.budget = budget
        self.files = SpillFiles(folder)
        # One lock, and a wake-up per waiter: a new task wakes only its targets (tasks on the
        # event loop) and a reply only the workflow (a thread). (One shared condition woke all
        # N sites for every event: N² work per round at a thousand sites.)
        self._cond = threading.Condition()
        self._site_tasks = {s: AsyncWaiters() for s in self.sites}  # PullTask on the event loop
        self._reply_ready = threading.Condition(self._cond)
        self._ids = itertools.count(1)
        self._tasks: dict[str, TaskEntry] = {}
        # a list, not a deque, per site: it holds a task or two, and a deque costs 600 bytes
        # empty (6 MB at 10,000 sites)
        self._queues: dict[str, list[str]] = {s: [] for s in self.sites}
        self._replies: dict[str, deque[ReplyEntry]] = {}
        self._dropped: dict[str, str] = {}
        self._rounds: dict[str, Any] = {}  # the round of the last task each site took
        self._ended = False

    # -- server worker side ---------------------------------------------------------------
    def add_task(self, targets: list[str], topic: str, headers: dict[str, Any],
                 frames: Iterable[bytes]) -> str:
        """Announce the task to its sites at once, then take its frames as they come."""
        unknown = [t for t in targets if t not in self._queues]
        if unknown or not targets:
            raise RelayError(f"task targets must be sites of this job {self.sites}; got {targets}")
        task_id = f"{self.prefix}{next(self._ids)}"
        spool = Spool(self.files, targets, self.budget, live=True)
        entry = TaskEntry(task_id, topic, headers, spool, set(targets))
        with self._cond:
            self._tasks[task_id] = entry
            self._replies[task_id] = deque()
            for site in targets:
                if site in self._dropped:
                    self._owe_error(entry, site, self._dropped[site])
                    spool.drop(site)
                else:
                    self._queues[site].append(task_id)
                    self._wake_site(site)
        spool.write(frames, self.max_payload)
        return task_id

    def share_files(self) -> None:
        """Payloads to and from the server worker go through the job's handoff folder: its
        worker runs on this host (``Launcher.shares_host``). Called before the worker starts,
        so before any task or reply."""
        if self.handoff is None:
            self.handoff = HandoffDir(self.folder / "handoff", create=True)

    def next_reply(self, task_id: str, wait_s: float) -> ReplyEntry | None:
        deadline = time.monotonic() + wait_s
        with self._cond:
            if task_id not in self._replies:
                raise RelayError(f"no such task {task_id}")
            while not self._replies[task_id]:
                left = deadline - time.monotonic()
                if left <= 0 or self._ended:
                    return None
                self._reply_ready.wait(left)
            return self._replies[task_id].popleft()

    # -- site side ----------------------------------------------------------------------------
    async def wait_task(self, site: str, wait_s: float) -> TaskEntry | object | None:
        """The site's next task, END once the job is over or the site dropped out, or None
        after wait_s. Sites call it on the server's event loop: it waits without a thread."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._cond:
                found = self._task_for(site)
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                woken = self._site_tasks[site].future()
            await until(woken, left)

    def _task_for(self, site: str) -> TaskEntry | object | None:
        """The site's next task, END, or None for nothing yet (lock held)."""
        if site not in self._queues:
            raise RelayError(f"{site} is not a site of job {self.job_id}")
        if self._ended or site in self._dropped:
            return END
        if self._queues[site]:
            entry = self._tasks[self._queues[site].pop(0)]
            self._rounds[site] = entry.headers.get("round")
            return entry
        return None

    def round_of(self, site: str) -> Any:
        """The round of the last task the site took (None: none yet, or a task of no round)."""
        return self._rounds.get(site)

    def requeue(self, site: str, reason: str) -> list[str]:
        """The site's part restarted: each task its old part took and has not answered is owed
        a retry error (the workflow sends it again); those it had not taken yet wait for the
        new part as they are. The ids of the tasks owed a retry."""
        owed = []
        with self._cond:
            if site not in self._queues or site in self._dropped or self._ended:
                return owed
            waiting = set(self._queues[site])
            for entry in self._tasks.values():
                if site not in entry.targets or entry.task_id in waiting:
                    continue
                if site in entry.replied:  # answered, or its answer is on its way in
                    entry.restarted.add(site)
                    continue
                entry.spool.drop(site)
                self._owe_error(entry, site, reason, retry=True)
                owed.append(entry.task_id)
        return owed

    def stale(self, task_id: str) -> bool:
        """A task of the run a server restart interrupted (a site's reply to it is dropped)."""
        if self.prefix == "t" or not _OLD_TASK.fullmatch(task_id):
            return False
        return not task_id.startswith(self.prefix)

    def open_reply(self, site: str, task_id: str, headers: dict[str, Any]) -> ReplyWriter:
        """Start taking a site's reply; the workflow sees it once committed."""
        with self._cond:
            entry = self._tasks.get(task_id)
            if entry is None or site not in entry.targets:
                raise RelayError(f"{site} was not sent task {task_id}")
            if site in entry.replied:
                raise RelayError(f"{site} already replied to task {task_id}")
            entry.replied.add(site)
        return ReplyWriter(self, entry, site, headers)

    def _reply_spool(self) -> Spool:
        own_file = self.handoff.create() if self.handoff is not None else None
        return Spool(self.files, ["workflow"], self.budget, live=False, own_file=own_file)

    def _deliver(self, reply: ReplyEntry) -> None:
        with self._cond:
            self._replies[reply.task_id].append(reply)
            self._reply_ready.notify_all()

    def _take_back(self, entry: TaskEntry, site: str) -> None:
        with self._cond:
            entry.replied.discard(site)
            if site in entry.restarted:  # the old part's reply broke off: the new one retries
                entry.restarted.discard(site)
                self._owe_error(entry, site, f"{site}'s part restarted", retry=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def drop_site(self, site: str, reason: str) -> None:
        with self._cond:
            if site in self._dropped or site not in self._queues:
                return
            self._dropped[site] = reason
            self._queues[site].clear()
            for entry in self._tasks.values():
                if site in entry.targets:
                    entry.spool.drop(site)
                    if site not in entry.replied:
                        self._owe_error(entry, site, reason)
            self._wake_site(site)

    def end(self) -> None:
        with self._cond:
            self._ended = True
            for site in self.sites:
                self._wake_site(site)
            self._reply_ready.notify_all()

    def close(self) -> None:
        """Free every payload still held (the job is over)."""
        with self._cond:
            spools = [e.spool for e in self._tasks.values()]
            spools += [r.spool for q in self._replies.values() for r in q if r.spool]
        for spool in spools:
            spool.close()
        self.files.close()
        if self.handoff is not None:
            self.handoff.close()

    @property
    def ended(self) -> bool:
        return self._ended

    def _wake_site(self, site: str) -> None:
        """Something for the site to pick up (lock held)."""
        self._site_tasks[site].wake()

    def _owe_error(self, entry: TaskEntry, site: str, reason: str, retry: bool = False) -> None:
        entry.replied.add(site)
        self._replies[entry.task_id].append(ReplyEntry(entry.task_id, site, {}, None, reason,
                                                       retry))
        self._reply_ready.notify_all()


class ReplyWriter:
    """One site's reply on its way in: frames appended as they arrive, then committed (the
    workflow sees it) or abandoned (the site may send it again).

    A reply of at most SMALL_REPLY bytes is held until it is whole and then written at once,
    within the server's memory budget for payloads (else it goes to its file as it comes): with
    its file open from its first frame, 10,000 sites replying at once held 10,000 files open,
    and the server ran out of descriptors."""

    def __init__(self, relay: JobRelay, entry: TaskEntry, site: str, headers: dict[str, Any]):
        self.relay, self.entry, self.site, self.headers = relay, entry, site, headers
        self.spool: Spool | None = None
        self._held: list[bytes] = []
        self._held_bytes = 0

    def append(self, raw: bytes) -> None:
        if self.spool is None:
            small = min(SMALL_REPLY, self.relay.max_payload or SMALL_REPLY)
            # held within the server's memory budget for payloads, like any payload it holds
            if self._held_bytes + len(raw) <= small and self.relay.budget.take(len(raw)):
                self._held.append(raw)
                self._held_bytes += len(raw)
                return
            self._spool()  # (a reply over the job's limit fails there, as any other)
        assert self.spool is not None
        self.spool.append(raw, self.relay.max_payload)

    def _spool(self) -> Spool:
        spool = self.spool = self.relay._reply_spool()
        held, self._held = self._held, []
        self._release()
        for raw in held:
            spool.append(raw, self.relay.max_payload)
        return spool

    def _release(self) -> None:
        self.relay.budget.give(self._held_bytes)
        self._held_bytes = 0

    def commit(self) -> None:
        spool = self.spool or self._spool()
        spool.finish()
        self.relay._deliver(ReplyEntry(self.entry.task_id, self.site, self.headers, spool))

    def abandon(self) -> None:
        self._held = []
        self._release()
        if self.spool is not None:
            self.spool.close()
        self.relay._take_back(self.entry, self.site)
