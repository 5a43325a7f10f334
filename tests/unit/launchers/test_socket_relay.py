"""The Docker launcher's per-job relay socket (launchers/socket_relay.py): bytes both ways to
the parent's unix socket or TCP endpoint, open to the container's uid, gone with the job."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from atoll.launchers.base import LaunchError
from atoll.launchers.socket_relay import UnixRelay


def _echo(listener: socket.socket) -> None:
    """A parent that answers each connection with what it got, upper-cased, until EOF."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())


@pytest.fixture(params=["unix", "tcp"])
def parent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "unix":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(tmp_path / "worker.sock"))
        target = f"unix:{tmp_path / 'worker.sock'}"
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        target = f"127.0.0.1:{listener.getsockname()[1]}"
    listener.listen(8)
    threading.Thread(target=_echo, args=(listener,), daemon=True).start()
    yield target
    listener.close()


def _dial(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(str(path))
    return sock


def test_bytes_pass_both_ways_and_close_cuts_everything(parent: str) -> None:
    relay = UnixRelay(parent)
    folder = relay.path.parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # no other host user reaches it
    assert stat.S_IMODE(relay.path.stat().st_mode) == 0o666  # the container's uid may differ
    big = os.urandom(3 << 20)
    with _dial(relay.path) as conn:
        def send() -> None:  # while this side reads: the echo answers as it receives
            conn.sendall(big)
            conn.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        got = bytearray()
        while data := conn.recv(1 << 20):
            got += data
        sender.join()
    assert bytes(got) == big.upper()
    live = _dial(relay.path)
    live.sendall(b"ping")
    assert live.recv(4) == b"PING"
    relay.close()
    assert live.recv(4) == b""  # cut: the job's link ends with the job
    live.close()
    assert not folder.exists()
    with pytest.raises(OSError):
        _dial(relay.path)


def test_an_unreachable_parent_refuses_the_worker(tmp_path: Path) -> None:
    relay = UnixRelay(f"unix:{tmp_path / 'nobody.sock'}")
    try:
        with _dial(relay.path) as conn:
            assert conn.recv(1) == b""  # closed at once, as a refused TCP connection
    finally:
        relay.close()


def test_a_target_without_a_port_is_refused() -> None:
    with pytest.raises(LaunchError, match="no port"):
        UnixRelay("parent-host")
