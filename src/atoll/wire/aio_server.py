"""A gRPC asyncio server on an event loop thread of its own, for a process otherwise threaded.

The server parent holds one control stream and one task long-poll per connected site. With
grpc.server each open call holds a thread, and at a thousand sites the parent spent most of its
time handing the GIL and futexes between three thousand threads (bench/scale.py). Handlers
written `async def` run on this loop instead, where an open call costs a task; handlers written
`def` still run on a thread of a small pool, as they would with grpc.server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent import futures
from typing import Any

import grpc

from atoll.wire.grpc_setup import OPTIONS


class LoopServer:
    def __init__(self, handler_threads: int = 64, blocking_threads: int = 8):
        self.loop = asyncio.new_event_loop()
        # Plain `def` handlers (admin calls, some of them long polls) run here...
        self._handlers = futures.ThreadPoolExecutor(handler_threads, thread_name_prefix="rpc")
        # ...and what an async handler must not do on the loop (SQLite, files) runs here, so a
        # burst of admin long polls cannot hold it up.
        self.loop.set_default_executor(
            futures.ThreadPoolExecutor(blocking_threads, thread_name_prefix="blocking"))
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-loop",
                                        daemon=True)
        self._thread.start()
        self.server: grpc.aio.Server = self._run(self._make())

    async def _make(self) -> grpc.aio.Server:
        return grpc.aio.server(migration_thread_pool=self._handlers, options=OPTIONS)

    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        async def add() -> int:
            return self.server.add_secure_port(address, credentials)

        return self._run(add())

    def start(self) -> None:
        self._run(self.server.start())

    def stop(self, grace: float) -> None:
        """Stop serving (calls in flight get `grace` seconds), then the loop and its threads."""
        try:
            self._run(self.server.stop(grace), timeout=grace + 5)
        except (futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self._handlers.shutdown(wait=False, cancel_futures=True)
