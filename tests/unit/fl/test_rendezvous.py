"""A site's ranks meet through a store that listens on MASTER_ADDR alone (issue 32, item 6).

PyTorch's default rendezvous (``env://``) has rank 0 run an unauthenticated TCPStore on every
interface of its node; another job found one and wrote its keys. Two real ranks (gloo, CPU) join
through atoll's TaskBroadcast; rank 0 then reads the kernel's socket tables for the store's port
and tries the store from an address other than MASTER_ADDR.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROGRAM = r'''
import json, os, socket
from atoll.fl.distributed import Ranks, TaskBroadcast

ranks = Ranks.from_env()
broadcast = TaskBroadcast(ranks)
broadcast.setup()
port = int(os.environ["MASTER_PORT"])
report = {"rank": ranks.rank}
if ranks.leader:
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                listening.append(address)
    report["listening"] = listening
    other = os.environ.get("ATOLL_TEST_OTHER_ADDRESS")
    if other:
        try:
            socket.create_connection((other, port), timeout=5).close()
            report["other_reached"] = True
        except OSError:
            report["other_reached"] = False
broadcast.close()
print(json.dumps(report))
'''
LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


def _port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _host_address() -> str | None:
    """An IPv4 address of this host other than loopback (a Slurm node's NodeAddr), if any."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return None
    return next((i[4][0] for i in infos if not i[4][0].startswith("127.")), None)


def _hex(address: str) -> str:
    return socket.inet_aton(address)[::-1].hex().upper()


def _two_ranks(master: str, other: str | None) -> list[dict]:
    env = {**os.environ, "MASTER_ADDR": master, "MASTER_PORT": str(_port(master)),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    if other:
        env["ATOLL_TEST_OTHER_ADDRESS"] = other
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_the_store_of_ranks_on_one_node_listens_on_loopback_only() -> None:
    zero, one = _two_ranks("127.0.0.1", _host_address())
    assert (zero["rank"], one["rank"]) == (0, 1)
    assert zero["listening"] == [LOOPBACK_HEX], f"the store listens on {zero['listening']}"
    if "other_reached" in zero:
        assert zero["other_reached"] is False


def test_the_store_of_a_multi_node_job_listens_on_its_first_nodes_address_only() -> None:
    # The first node's address; on a host with loopback only, 127.0.0.2 (also this host's,
    # yet not the address another job dials).
    host = _host_address() or "127.0.0.2"
    zero, _ = _two_ranks(host, "127.0.0.1")
    assert zero["listening"] == [_hex(host)], f"the store listens on {zero['listening']}"
    assert zero["other_reached"] is False  # not on loopback, nor any other interface
