"""server/waiters.py's StoreChanges: a status long poll waits on a future that a write to the
job store (a real SQLite file), from any thread, settles. Timeouts only guard against a hang."""

from __future__ import annotations

import asyncio
import threading

from atoll.server.sqlite_store import SqliteStore
from atoll.server.waiters import StoreChanges


def test_a_write_from_another_thread_wakes_the_waiter(tmp_path):
    store, stop = SqliteStore(tmp_path / "atoll.db"), threading.Event()
    changes = StoreChanges(store, stop.is_set)

    async def main() -> None:
        waiter = asyncio.create_task(changes.wait(store.version, 600))
        await asyncio.sleep(0)  # the waiter holds its future now
        assert not waiter.done()
        threading.Thread(target=store.add_event, args=("job", "site", {})).start()
        await asyncio.wait_for(waiter, 60)

    try:
        asyncio.run(main())
    finally:
        stop.set()
        store.close()


def test_a_waiter_behind_the_store_returns_at_once(tmp_path):
    store, stop = SqliteStore(tmp_path / "atoll.db"), threading.Event()
    changes = StoreChanges(store, stop.is_set)
    since = store.version
    store.add_event("job", "site", {})

    async def main() -> None:
        await asyncio.wait_for(changes.wait(since, 600), 60)

    try:
        asyncio.run(main())
    finally:
        stop.set()
        store.close()
