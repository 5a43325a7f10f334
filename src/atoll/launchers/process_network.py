"""The process launcher's network: each worker in a namespace of its own, plus what the site allows.

With ``process.network`` isolated (the default) the sandbox gets ``bwrap --unshare-net``: a
network namespace with nothing but its own loopback. The worker reaches

- its parent through the parent's unix socket, bound into the sandbox (``ATOLL_PARENT`` is
  ``unix:<path>``; the job token is checked there as on TCP);
- the other ranks of its job, which run in the same sandbox: its loopback is the job's alone,
  so a rendezvous (``MASTER_ADDR=127.0.0.1``) is never reachable from another job;
- the destinations site.yaml allows (``process.network.allow``, e.g. the site's MLflow server),
  each through two relays: the parent listens on one unix socket per destination in a private
  folder (``Relays``) and connects to the destination for each connection; inside the sandbox
  the worker's own atoll code, before any job code runs, listens on the destination's address
  in the namespace and relays to that socket (``forward_inside``). A destination named by a
  host name gets a loopback address of its own in the sandbox's ``/etc/hosts``.

Nothing else: no host socket shows in ``/proc/net``, and the host's abstract unix sockets (the
Docker daemon's, systemd's) are out of reach, since those belong to a network namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from atoll.spec import worker_env

FORWARD_ENV = worker_env.NETWORK_FORWARD  # JSON [[listen address, port, unix socket], ...]
HOSTS_FILE = "hosts"
CHUNK = 64 * 1024
# A unix socket's path is at most 107 bytes: the private folder goes where paths are short.
SOCKET_PARENT = "/tmp"
BACKLOG = 64


class Relays:
    """The parent's side: one unix socket per allowed destination, in a folder of its own (0700),
    each connection relayed to the destination (resolved on the parent's host, at connect)."""

    def __init__(self, destinations: Sequence[tuple[str, int, str]]) -> None:
        # (host, port, the loopback address the worker dials it at in its sandbox)
        self.destinations = tuple(destinations)
        base = SOCKET_PARENT if os.path.isdir(SOCKET_PARENT) else None
        self.folder = tempfile.mkdtemp(prefix="atoll-net-", dir=base)
        self._listeners: list[socket.socket] = []
        try:
            for index, (host, port, _) in enumerate(self.destinations):
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._listeners.append(listener)
                listener.bind(self.socket_path(index))
                listener.listen(BACKLOG)
                dial = _dialer(host, port)
                threading.Thread(target=_serve, args=(listener, dial), daemon=True,
                                 name=f"relay-{host}:{port}").start()
            self._write_hosts()
        except BaseException:
            self.close()
            raise

    def socket_path(self, index: int) -> str:
        return relay_socket(self.folder, index)

    @property
    def hosts_file(self) -> str | None:
        """The sandbox's /etc/hosts when a destination is named by a host name, else None."""
        path = os.path.join(self.folder, HOSTS_FILE)
        return path if os.path.exists(path) else None

    def forward_spec(self) -> str:
        return forward_spec(self.destinations, self.folder)

    def _write_hosts(self) -> None:
        """The host's /etc/hosts less the destinations' names, which come first, each on its
        loopback address (the first match wins a lookup)."""
        named = {host.lower(): listen for host, _, listen in self.destinations if host != listen}
        if not named:
            return
        try:
            base = Path("/etc/hosts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            base = "127.0.0.1 localhost\n"
        lines = ["# atoll: the site's allowed destinations (process.network.allow), relayed",
                 *(f"{listen} {host}" for host, listen in named.items())]
        for line in base.splitlines():
            fields = line.split("#", 1)[0].split()
            kept = [name for name in fields[1:] if name.lower() not in named]
            if len(fields) < 2 or len(kept) == len(fields) - 1:
                lines.append(line)
            elif kept:
                lines.append(" ".join([fields[0], *kept]))
        Path(self.folder, HOSTS_FILE).write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def relay_socket(folder: str, index: int) -> str:
    return os.path.join(folder, f"dest-{index}.sock")


def forward_spec(destinations: Sequence[tuple[str, int, str]], folder: str) -> str:
    """What the worker's forwarder listens on and relays to (FORWARD_ENV)."""
    return json.dumps([[listen, port, relay_socket(folder, i)]
                       for i, (_, port, listen) in enumerate(destinations)])


def _dialer(host: str, port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection((host, port), timeout=30)


def forward_inside(spec: str) -> None:
    """The worker's side, in its namespace: listen on each destination's address and relay each
    connection to the parent's socket for it. Daemon threads: they end with the worker."""
    for listen, port, path in json.loads(spec):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((str(listen), int(port)))
        listener.listen(BACKLOG)

        def dial(path: str = str(path)) -> socket.socket:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(path)
            return conn

        threading.Thread(target=_serve, args=(listener, dial), daemon=True,
                         name=f"forward-{listen}:{port}").start()


def _serve(listener: socket.socket, dial: Callable[[], socket.socket]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_relay, args=(client, dial), daemon=True).start()


def _relay(client: socket.socket, dial: Callable[[], socket.socket]) -> None:
    try:
        upstream = dial()
    except OSError:
        client.close()  # the destination is down: the caller sees its connection closed
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until ``source`` ends, then pass the end on (half-close), as TCP would."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
