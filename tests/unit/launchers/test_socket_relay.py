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
    fd = os.open(path.parent, os.O_PATH)  # the path may be longer than a socket address
    try:
        sock.connect(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)
    return sock


def test_bytes_pass_both_ways_and_close_cuts_everything(parent: str, tmp_path: Path) -> None:
    # A run folder deeper than a socket's path may be (107 bytes).
    folder = tmp_path / ("run-folder-" * 12)
    folder.mkdir()
    relay = UnixRelay(parent, folder)
    assert len(str(relay.path)) > 108
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
    assert not relay.path.exists() and folder.exists()  # the socket goes, the run folder stays


def test_an_unreachable_parent_refuses_the_worker(tmp_path: Path) -> None:
    relay = UnixRelay(f"unix:{tmp_path / 'nobody.sock'}", tmp_path)
    try:
        with _dial(relay.path) as conn:
            assert conn.recv(1) == b""  # closed at once, as a refused TCP connection
    finally:
        relay.close()


def test_a_target_without_a_port_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="no port"):
        UnixRelay("parent-host", tmp_path)


def test_a_resumed_job_gets_a_fresh_socket_and_a_replaced_one_is_left(tmp_path: Path,
                                                                      parent: str) -> None:
    UnixRelay(parent, tmp_path)  # a previous run's, never closed (the parent died)
    relay = UnixRelay(parent, tmp_path)
    relay.path.unlink()
    relay.path.write_text("the job's own file")  # the job replaced the socket
    relay.close()
    assert relay.path.read_text() == "the job's own file"  # close removes only a socket
