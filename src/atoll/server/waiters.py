"""Asyncio tasks waiting on state that threads change under a lock.

The server's site-facing calls run on one event loop (wire/aio_server.py) while the workflow's
side of the relay runs on threads. Where a threading.Condition wakes waiting threads, an
AsyncWaiters next to it wakes waiting tasks: a task takes a future while it holds the lock and
finds nothing to do, then awaits it without the lock; whoever changes the state wakes them all.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


def _settle(future: asyncio.Future) -> None:
    if not future.done():  # a waiter whose time ran out has cancelled it
        future.set_result(None)


class AsyncWaiters:
    def __init__(self) -> None:
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def future(self) -> asyncio.Future:
        """A future the next wake() settles. Call with the lock held, on the event loop."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((loop, future))
        return future

    def wake(self) -> None:
        """Settle every waiting future. Call with the lock held, from any thread."""
        waiting, self._waiting = self._waiting, []
        for loop, future in waiting:
            try:
                loop.call_soon_threadsafe(_settle, future)
            except RuntimeError:  # its loop is closed: the server is stopping
                pass


async def until(future: asyncio.Future, timeout: float) -> None:
    """Wait for a wake() or for timeout seconds, whichever comes first."""
    try:
        await asyncio.wait_for(future, timeout)
    except TimeoutError:
        pass


class StoreChanges:
    """Tasks waiting for the job store to change (`job status --wait`): one thread waits on the
    store's condition and wakes them, so an admin's long poll holds a future, not a thread."""

    def __init__(self, store, stopping: Callable[[], bool]):
        self.store, self.stopping = store, stopping
        self._lock = threading.Lock()
        self._waiters = AsyncWaiters()
        self._thread: threading.Thread | None = None

    def _watch(self, seen: int) -> None:
        while not self.stopping():
            now = self.store.wait_for_change(seen, 1.0)
            if now != seen:
                with self._lock:
                    self._waiters.wake()
                seen = now

    async def wait(self, since: int, timeout: float) -> None:
        """Until the store's version is no longer `since`, or timeout seconds."""
        with self._lock:
            if self._thread is None:  # started by the first watcher, not at rest
                # from the version read under the lock: no change after it goes unseen
                self._thread = threading.Thread(target=self._watch, args=(self.store.version,),
                                                name="store-changes", daemon=True)
                self._thread.start()
            if self.store.version != since:
                return
            future = self._waiters.future()
        await until(future, timeout)
