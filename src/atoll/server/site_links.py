"""The server's view of connected site parents: one control stream each, and liveness.

A link's control stream is served on the server's event loop (federation_service.py); anything
may send on it from any thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.wire import messages as msg
from atoll.wire.frames import MAX_CONTROL

HEARTBEAT_S = 5.0
STALE_S = 20.0  # a site silent this long is treated as gone


class ControlTooLarge(AtollError, ValueError):
    """A command would not fit in one control message; it is not sent (the link stays up)."""

    exit_code = EXIT_INVALID


@dataclass
class SiteLink:
    name: str
    org: str
    hello: dict[str, Any]
    loop: asyncio.AbstractEventLoop  # the one that serves the control stream
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)  # None ends the stream
    closed: threading.Event = field(default_factory=threading.Event)

    def send(self, kind: str, body: dict[str, Any]) -> None:
        text = json.dumps(body)
        # Over gRPC's message limit, the stream breaks and every job of the site with it.
        if len(text) > MAX_CONTROL:
            raise ControlTooLarge(f"a {kind} command of {len(text):,} bytes is over the "
                                  f"{MAX_CONTROL:,}-byte limit of a control message")
        self._put(msg.ServerCommand(**{kind: text}))

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

    def stale(self) -> list[SiteLink]:
        cutoff = time.monotonic() - STALE_S
        with self._lock:
            return [link for link in self._links.values() if link.last_seen < cutoff]
