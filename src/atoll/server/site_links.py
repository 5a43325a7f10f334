"""The server's view of connected site parents: one control stream each, and liveness.

A link's control stream is served on the server's event loop (federation_service.py); anything
may send on it from any thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.wire import messages as msg
from atoll.wire.frames import MAX_CONTROL

HEARTBEAT_S = 5.0
STALE_S = 20.0  # a site silent this long is treated as gone
# Each heartbeat costs the server's event loop about 0.25 ms (gRPC's per-message work): a site
# that connects is asked for one every HEARTBEAT_S, or less often once so many sites are
# online that the server would otherwise take more than BEATS_PER_S of them a second (at
# 10,000 sites, every 50 s rather than every 5: 200 a second, not 2,000). The sites that
# connected while there were fewer are asked again (`repace`) once their period is REPACE
# times too short. A link is stale after STALE_BEATS of its own periods, at least STALE_S.
BEATS_PER_S = 200.0
MAX_HEARTBEAT_S = 60.0
REPACE = 1.25
STALE_BEATS = 4
# how long a site's control stream may go without a message before the server's read gives up:
# beyond the longest a link can be stale, so that the stale check alone decides
CONNECT_QUIET_S = STALE_BEATS * MAX_HEARTBEAT_S + 10.0


class ControlTooLarge(AtollError, ValueError):
    """A command would not fit in one control message; it is not sent (the link stays up)."""

    exit_code = EXIT_INVALID


def command(kind: str, body: dict[str, Any]) -> msg.ServerCommand:
    """A control command, checked to fit in one control message."""
    text = json.dumps(body)
    # Over gRPC's message limit, the stream breaks and every job of the site with it.
    if len(text) > MAX_CONTROL:
        raise ControlTooLarge(f"a {kind} command of {len(text):,} bytes is over the "
                              f"{MAX_CONTROL:,}-byte limit of a control message")
    return msg.ServerCommand(**{kind: text})


class Outbox:
    """What a control stream sends next: put on the loop (SiteLink._put hands it there), taken
    by the stream's one writer. An asyncio.Queue and a threading.Event cost 4.5 KB a link at
    rest, 45 MB of a server's memory at 10,000 sites (issue 40); this is a list and a future."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[msg.ServerCommand | None] = []
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: msg.ServerCommand | None) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_nowait(self) -> msg.ServerCommand | None:
        return self._items.pop(0)

    async def get(self) -> msg.ServerCommand | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)

    def __len__(self) -> int:
        return len(self._items)


class Closed:
    """Set once a link is replaced or gone; read by the revocation watch. Nothing waits on it,
    so a flag rather than a threading.Event (1.2 KB)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@dataclass(slots=True)
class SiteLink:
    name: str
    org: str
    hello: dict[str, Any]
    loop: asyncio.AbstractEventLoop  # the one that serves the control stream
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    outbox: Outbox = field(default_factory=Outbox)  # None ends the stream
    closed: Closed = field(default_factory=Closed)
    heartbeat_s: float = HEARTBEAT_S  # what its welcome asked of it

    def send(self, kind: str, body: dict[str, Any]) -> None:
        self._put(command(kind, body))

    def close(self) -> None:
        self.closed.set()
        self._put(None)

    def _put(self, item: msg.ServerCommand | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outbox.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    @property
    def capacity(self) -> dict[str, Any]:
        return self.hello.get("capacity") or {}

    @property
    def launcher(self) -> str:
        """The site's backend, as it said at hello ("" if it did not): the job's
        launcher_spec block for it may hold a native GPU count."""
        value = self.hello.get("launcher")
        return value if isinstance(value, str) else ""

    @property
    def running_jobs(self) -> list[str]:
        return list(self.hello.get("running_jobs") or [])


class SiteLinks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[str, SiteLink] = {}

    def attach(self, link: SiteLink) -> SiteLink | None:
        """Register a new link; returns the one it replaces (a reconnecting site)."""
        with self._lock:
            old = self._links.get(link.name)
            self._links[link.name] = link
        if old is not None:
            old.close()
        return old

    def detach(self, link: SiteLink) -> bool:
        """Forget a link if it is still the current one for its site."""
        with self._lock:
            if self._links.get(link.name) is link:
                del self._links[link.name]
                link.close()
                return True
        return False

    def get(self, name: str) -> SiteLink | None:
        with self._lock:
            return self._links.get(name)

    def online(self) -> dict[str, SiteLink]:
        with self._lock:
            return dict(self._links)

    def send(self, site: str, kind: str, body: dict[str, Any]) -> bool:
        link = self.get(site)
        if link is None:
            return False
        link.send(kind, body)
        return True

    def send_all(self, sites: Iterable[str], kind: str, body: dict[str, Any]) -> list[str]:
        """The same command to each of `sites` that is online, encoded once and shared (a job's
        dispatch to 10,000 sites: one message, not 10,000 copies, each held by its stream
        until the next); the sites that were not online."""
        shared = command(kind, body)
        with self._lock:
            links = [(site, self._links.get(site)) for site in sites]
        for _, link in links:
            if link is not None:
                link._put(shared)
        return [site for site, link in links if link is None]

    def heartbeat_period(self) -> float:
        """The heartbeat period to ask of a site connecting now (see BEATS_PER_S)."""
        with self._lock:
            return _period(len(self._links) + 1)

    def repace(self) -> list[SiteLink]:
        """The links asked for heartbeats REPACE times too often for the sites online now, each
        given the period it should have: the caller tells their sites. A period is never
        shortened: a site would then be stale before it heard of it."""
        with self._lock:
            period = _period(len(self._links))
            slow = [link for link in self._links.values() if link.heartbeat_s * REPACE <= period]
            for link in slow:
                link.heartbeat_s = period
        return slow

    def stale(self) -> list[SiteLink]:
        now = time.monotonic()
        with self._lock:
            return [link for link in self._links.values()
                    if now - link.last_seen > max(STALE_S, STALE_BEATS * link.heartbeat_s)]


def _period(online: int) -> float:
    return min(MAX_HEARTBEAT_S, max(HEARTBEAT_S, online / BEATS_PER_S))
