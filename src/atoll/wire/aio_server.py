"""A gRPC asyncio server on an event loop thread of its own, for a process otherwise threaded.

The server parent holds one control stream and one task long-poll per connected site. With
grpc.server each open call holds a thread, and at a thousand sites the parent spent most of its
time handing the GIL and futexes between three thousand threads (bench/scale.py). Handlers
written `async def` run on this loop instead, where an open call costs a task; handlers written
`def` still run on a thread of a small pool, as they would with grpc.server.

Services are registered with `serve` (wire/guard.py): each call is admitted before its request
is read, and every read has a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent import futures
from typing import Any

import grpc

from atoll.wire.grpc_setup import OPTIONS
from atoll.wire.guard import Admit, Deadlines, guarded_handlers

# A connection must finish its TLS handshake (and send its HTTP/2 settings) within this. gRPC's
# default, 120 s, let a peer hold a connection slot and its memory with a stalled ClientHello.
# Not less: with 5 s, 110 of 1,000 sites reconnecting at once (bench/scale.py on a loaded
# 2-core machine) were dropped mid-handshake and had to start over; with 10 s, none.
HANDSHAKE_TIMEOUT_S = 10
# gRPC's core sheds calls that arrived but that the loop has not taken up yet by random early
# detection, from 1,000 such calls (half refused at 2,000, all at 3,000), and the site sees
# CANCELLED. When a job starts, every site fetches it at once: at 3,000 sites about half the
# fetches and task polls (and the admin's calls) were refused that way and the job failed
# (bench/scale.py). A backlog for 10,000 sites and more; what one certificate may hold open is
# bounded by the Gate (server/auth.py LIMITS), not by this.
# Such a call also waits at most 30 s by default before gRPC cancels it: at 10,000 sites the
# loop took up the job's fetches more slowly than that (2,308 CANCELLED); the backlog's bound
# above, not this wait, is what holds its memory.
MAX_PENDING_CALLS = 20_000
MAX_PENDING_S = 300
SERVER_OPTIONS = [*OPTIONS, ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_S * 1000),
                  ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                  ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS),
                  ("grpc.server_max_unrequested_time_in_server", MAX_PENDING_S)]


class LoopServer:
    def __init__(self, handler_threads: int = 64, blocking_threads: int = 8,
                 tls_record_bytes: int | None = None):
        # the largest TLS record it sends (site.yaml's links.tls_record_bytes; None: gRPC's)
        self._options = SERVER_OPTIONS + ([("grpc.tsi.max_frame_size", tls_record_bytes)]
                                          if tls_record_bytes is not None else [])
        self.loop = asyncio.new_event_loop()
        # Plain `def` handlers (job uploads and downloads) run here...
        self._handlers = futures.ThreadPoolExecutor(handler_threads, thread_name_prefix="rpc")
        # ...and what an async handler must not do on the loop (SQLite, small files) runs here,
        # so a burst of uploads cannot hold it up.
        self.loop.set_default_executor(
            futures.ThreadPoolExecutor(blocking_threads, thread_name_prefix="blocking"))
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-loop",
                                        daemon=True)
        self._thread.start()
        self.server: grpc.aio.Server = self._run(self._make())

    async def _make(self) -> grpc.aio.Server:
        return grpc.aio.server(migration_thread_pool=self._handlers, options=self._options)

    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def serve(self, service: str, servicer: object, admit: Admit,
              deadlines: dict[str, Deadlines] | None = None) -> None:
        """Serve `service` with servicer's methods: plain ones on the handler threads."""
        self.server.add_generic_rpc_handlers(
            (guarded_handlers(service, servicer, admit, self._handlers, deadlines),))

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
