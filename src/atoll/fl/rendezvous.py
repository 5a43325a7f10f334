"""The store of a site's ranks' rendezvous, listening on the job's own address only.

``torch.distributed``'s default rendezvous (``env://``) makes rank 0 run a TCPStore that listens
on every interface of its node at ``MASTER_PORT``: unauthenticated, so any process that reaches
the node could read and write the job's keys (issue 32: another job did). Here rank 0 binds the
store's socket itself, to ``MASTER_ADDR`` only (127.0.0.1 for the ranks of one container, Pod or
process sandbox; the first node's address on Slurm), and hands it to the store; the other ranks
dial it as before. Where that cannot be done (a torch without ``master_listen_fd``, or an address
that is not this node's), rank 0 falls back to ``env://`` and says so.

A script that creates the default process group itself chooses its own rendezvous.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)
STORE_TIMEOUT = timedelta(minutes=30)  # PyTorch's default for init_process_group


def bound_listener(host: str, port: int) -> socket.socket | None:
    """A listening socket on ``host:port`` alone; None where ``host`` is not this node's."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError:
            sock.close()
    return None


def job_store(rank: int, world_size: int, environ: Mapping[str, str] | None = None) -> Any:
    """The TCPStore of this job's rendezvous, rank 0's bound to MASTER_ADDR; None: use env://."""
    import torch.distributed as dist

    env = os.environ if environ is None else environ
    host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=STORE_TIMEOUT)
    listener = bound_listener(host, port)
    if listener is None:
        log.warning("the rendezvous store cannot listen on MASTER_ADDR %s alone (not an address "
                    "of this node): it listens on every interface", host)
        return None
    try:
        # The store owns the socket from here on (use_libuv=False: libuv's server cannot
        # take a socket it did not make).
        return dist.TCPStore(host, port, world_size, is_master=True, timeout=STORE_TIMEOUT,
                             master_listen_fd=listener.detach(), use_libuv=False)
    except TypeError:  # a torch older than master_listen_fd
        log.warning("this torch cannot bind the rendezvous store to MASTER_ADDR %s: it "
                    "listens on every interface", host)
        return None
