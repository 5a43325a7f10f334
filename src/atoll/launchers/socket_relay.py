"""A per-job unix socket that relays to the parent's worker endpoint (the Docker launcher's).

A job container has no network (``network_mode: none``): no route to other jobs, to the host's
listeners or to the engine's abstract sockets. Its one way out is this socket, bind-mounted into
the container: every connection to it is relayed, byte for byte, to the parent's own endpoint:
its unix socket (``unix:<path>``, in the parent's private folder) where it has one, else its TCP
address. The relay understands nothing of what passes: the worker still proves itself to the
parent with its one-time job token.

A socket per job rather than the parent's own: it can be opened to the container's user (which
may not be the parent's) without opening the parent's, and it is gone when the job ends, with
every connection through it.

The socket lives in the job's run folder, which the engine already binds into the container (at
the same path inside a parent container as on the host, so it needs no mount of its own); it is
open to every uid, because the container's user may be another one than the parent's, and the
run folder's own permissions keep the host's other users out. ``close`` stops accepting, cuts
the open connections and removes the socket. The job may delete or replace the socket's file:
that only cuts its own link, since the relay holds its listening socket, not the path.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
from pathlib import Path

from atoll.launchers.base import LaunchError
from atoll.spec.names import address_host

SOCKET_NAME = ".atoll-parent.sock"  # in the job's run folder
CHUNK = 1 << 18


UNIX_PREFIX = "unix:"


def _connect(target: str) -> socket.socket:
    """A connection to ``unix:<path>`` or ``host:port``."""
    if target.startswith(UNIX_PREFIX):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(target.removeprefix(UNIX_PREFIX))
        except OSError:
            sock.close()
            raise
        return sock
    port = target.rsplit(":", 1)[-1]
    sock = socket.create_connection((address_host(target), int(port)), timeout=10)
    sock.settimeout(None)
    return sock


class UnixRelay:
    """Listen on a new unix socket; relay each connection to ``target`` (``unix:<path>`` or
    ``host:port``)."""

    def __init__(self, target: str, folder: Path, name: str = SOCKET_NAME) -> None:
        if not target.startswith(UNIX_PREFIX) and not target.rsplit(":", 1)[-1].isdigit():
            raise LaunchError(f"the parent's worker address {target!r} has no port to relay to")
        self._target = target
        self.path = Path(folder) / name
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Through the folder's descriptor: a socket's path is at most 107 bytes, a run folder's
        # may be longer (and a link planted in its place is not followed).
        dir_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(name, dir_fd=dir_fd)  # a previous run's (a resumed job's)
            short = f"/proc/self/fd/{dir_fd}/{name}"
            self._listener.bind(short)
            os.chmod(short, 0o666)  # the container's uid may not be the parent's
            self._listener.listen(16)
        except OSError:
            self._listener.close()
            raise
        finally:
            os.close(dir_fd)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="atoll-relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                outside = _connect(self._target)
            except OSError:
                inside.close()  # the worker sees its connection refused, as with TCP
                continue
            pair = (inside, outside)
            with self._lock:
                if self._closed:
                    inside.close()
                    outside.close()
                    return
                self._open.update(pair)
            done = threading.Barrier(2, action=lambda pair=pair: self._forget(pair))
            for src, dst in (pair, pair[::-1]):
                threading.Thread(target=self._pump, args=(src, dst, done), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, done: threading.Barrier) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)  # the other direction may still be talking
        with contextlib.suppress(threading.BrokenBarrierError):
            done.wait()  # the last of the two directions closes the pair

    def _forget(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            self._open.difference_update(pair)
        for sock in pair:
            sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._open = self._open, set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with contextlib.suppress(OSError):  # the job may have removed or replaced it
            if stat.S_ISSOCK(self.path.lstat().st_mode):
                self.path.unlink()
