"""Two real ranks of one site: a program run as RANK 0 and 1 on one node (gloo, CPU), as a
launcher would start them, each printing what it saw as JSON on its last line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(program: str, timeout: float) -> tuple[list[int], list[tuple[str, str]]]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [p.returncode for p in procs], outs


def run_two_ranks(program: str, timeout: float = 120) -> list[dict]:
    """Each rank's JSON report; fails the test, with both ranks' output, if either failed."""
    codes, outs = _start(program, timeout)
    # The free port is found, then let go before rank 0 binds it: another test's process may
    # take it meanwhile (the suite runs many). That alone is worth another port, nothing else.
    for _ in range(2):
        if codes == [0, 0] or "address already in use" not in str(outs).lower():
            break
        codes, outs = _start(program, timeout)
    assert codes == [0, 0], outs
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
