"""Running the dashboard: bind a port (a free one on the loopback address by default), tell
the URL with its one-time token, serve until Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable

import uvicorn

from atoll.admin.session import Session
from atoll.dashboard.access import Secrets
from atoll.dashboard.app import build
from atoll.dashboard.federation import Federation


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Named TCP, asyncio sets TCP_NODELAY on each connection (it skips a socket of protocol 0):
    # without it each small answer, written as headers then body, waited ~40 ms on the
    # browser's delayed ACK, most of a first page load.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server that first tells the pages' event streams to end when it stops."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event):
        super().__init__(config)
        self.stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.stopping.set()
        await super().shutdown(sockets)


def serve(session: Session, study: str | None, host: str, port: int, public: bool,
          announce: Callable[[str], None], open_browser: bool) -> None:
    sock = bind(host, port)
    port = sock.getsockname()[1]
    keys = Secrets()
    stopping = asyncio.Event()
    app = build(Federation(session, study), keys, port, public, stopping)
    shown = f"[{host}]" if ":" in host else ("127.0.0.1" if host in ("", "0.0.0.0") else host)
    url = f"http://{shown}:{port}/?token={keys.token}"
    announce(url)
    if open_browser and _has_display():
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=1, server_header=False)
    try:
        _Server(config, stopping).run(sockets=[sock])
    finally:
        sock.close()


def _has_display() -> bool:
    """A graphical session to open a browser in (never a text browser in this terminal)."""
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY")
                                            or os.environ.get("WAYLAND_DISPLAY"))
