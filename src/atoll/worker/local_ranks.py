"""A site's other processes on this node, started by rank 0 as ``torchrun --nproc-per-node`` does.

The process, Docker and Kubernetes launchers start one worker per job; when the job asks for
several processes they set ``LOCAL_WORLD_SIZE=N`` (and ``WORLD_SIZE``, ``MASTER_ADDR``) but no
``RANK``. That worker becomes rank 0: it picks a free port for the rendezvous
(``MASTER_PORT``: only a process on the node can know one is free), registers with its parent,
then starts ranks 1..N-1 as ``python -m atoll.worker`` children with their own ``RANK`` and
``LOCAL_RANK``, one GPU each (the N ids of ``CUDA_VISIBLE_DEVICES`` are dealt out), tied to its
life and without any credential. On Slurm, ``srun`` starts every rank itself (slurm_render.py).

A rank that fails fails the site's part: it writes its error to ``logs/rank-<r>.error`` in the
run folder, and rank 0, which watches its children, reports that error to the parent, stops the
other ranks and exits. Rank 0 failing takes its children with it (their lifeline is rank 0).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path

from atoll.launchers.rank_names import MAX_RANK_ERROR_BYTES as MAX_ERROR_CHARS
from atoll.launchers.rank_names import RANK_ERROR_FILE as ERROR_FILE
from atoll.launchers.rank_names import WITHHELD_ENV
from atoll.spec import worker_env

POLL_S = 0.2  # how often rank 0 looks at its children
FINISH_GRACE_S = 60.0
CAUSE_GRACE_S = 3.0  # how long rank 0, failed itself, waits for another rank's failure  # how long the other ranks may take to end after rank 0's script did


def starts_local_ranks(environ: MutableMapping[str, str]) -> bool:
    """Whether this worker is the one the launcher started for several processes."""
    return "RANK" not in environ and int(environ.get("LOCAL_WORLD_SIZE") or 1) > 1


def gpu_of(local_rank: int, environ: MutableMapping[str, str]) -> str | None:
    """The one GPU id of ``local_rank`` when the node's ids are one per process, else None."""
    ids = [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    count = int(environ.get("LOCAL_WORLD_SIZE") or 1)
    return ids[local_rank] if count > 1 and len(ids) == count else None


def one_gpu_per_rank(environ: MutableMapping[str, str]) -> None:
    """Keep only this rank's GPU visible (Slurm ranks, which see the whole node's)."""
    gpu = gpu_of(int(environ.get("LOCAL_RANK") or 0), environ)
    if gpu is not None:
        environ["CUDA_VISIBLE_DEVICES"] = gpu


def become_rank_zero(environ: MutableMapping[str, str]) -> list[str | None]:
    """The rendezvous of this node's processes, seen from rank 0; returns the GPU id of each
    local rank (None: it sees the node's GPUs as they are)."""
    count = int(environ["LOCAL_WORLD_SIZE"])
    gpus = [gpu_of(local_rank, environ) for local_rank in range(count)]
    environ.setdefault("MASTER_ADDR", "127.0.0.1")
    environ.setdefault("MASTER_PORT", str(free_port(environ["MASTER_ADDR"])))
    environ.setdefault("WORLD_SIZE", str(count))
    environ["RANK"] = environ["LOCAL_RANK"] = "0"
    if gpus[0] is not None:
        environ["CUDA_VISIBLE_DEVICES"] = gpus[0]
    return gpus


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_rank_error(workdir: Path, rank: int, error: str) -> None:
    """What a failed rank leaves for rank 0 to report (best effort: the log has it all)."""
    path = workdir / ERROR_FILE.format(rank=rank)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(error[-MAX_ERROR_CHARS:])


def rank_error(workdir: Path, rank: int) -> str:
    path = workdir / ERROR_FILE.format(rank=rank)
    try:
        return path.read_text(errors="replace")[-MAX_ERROR_CHARS:].strip()
    except OSError:
        return ""


class LocalRanks:
    """Ranks 1..N-1 of this node, children of rank 0."""

    def __init__(self, environ: MutableMapping[str, str], workdir: Path,
                 gpus: list[str | None], withheld: set[str]) -> None:
        self.count = len(gpus)
        self.gpus = gpus
        self.workdir = workdir
        # The children's environment: rank 0's, less what only rank 0 may hold (the pipe's
        # credentials, and in a container the secrets its launcher named).
        withheld = withheld | set(filter(None, environ.get(WITHHELD_ENV, "").split(",")))
        self._base = {k: v for k, v in environ.items() if k not in withheld}
        self._children: dict[int, subprocess.Popen] = {}
        self._ending = threading.Event()

    def start(self) -> None:
        for local_rank in range(1, self.count):
            env = {**self._base, "RANK": str(local_rank), "LOCAL_RANK": str(local_rank),
                   worker_env.PARENT_PID: str(os.getpid())}  # their lifeline is rank 0
            if self.gpus[local_rank] is not None:
                env["CUDA_VISIBLE_DEVICES"] = self.gpus[local_rank]
            self._children[local_rank] = subprocess.Popen(
                [sys.executable, "-m", "atoll.worker"], env=env, stdin=subprocess.DEVNULL,
                close_fds=True)

    def watch(self, on_failure: Callable[[str], None]) -> None:
        """Call ``on_failure(reason)`` from a thread of its own if a rank fails first."""

        def loop() -> None:
            while not self._ending.is_set():
                failed = self._first_failure()
                if failed is not None and not self._ending.is_set():
                    on_failure(failed)
                    return
                time.sleep(POLL_S)

        threading.Thread(target=loop, name="local-ranks", daemon=True).start()

    def finish(self, timeout: float = FINISH_GRACE_S) -> str | None:
        """After rank 0's script ended: wait for the other ranks; the first failure, if any."""
        self._ending.set()
        deadline = time.monotonic() + timeout
        for local_rank, child in self._children.items():
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                return f"rank {local_rank} did not end within {timeout:g} s after rank 0"
        return self._first_failure()

    def root_cause(self, timeout: float = CAUSE_GRACE_S) -> str | None:
        """After rank 0 failed: a rank that failed (or fails within ``timeout``) is the likely
        cause, rank 0 having only lost its peer in a collective ("Connection closed by peer")."""
        self._ending.set()
        deadline = time.monotonic() + timeout
        while (failed := self._first_failure()) is None and time.monotonic() < deadline:
            if all(child.poll() is not None for child in self._children.values()):
                return None
            time.sleep(POLL_S / 4)
        return failed

    def stop(self) -> None:
        self._ending.set()
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
        for child in self._children.values():
            child.wait()

    def _first_failure(self) -> str | None:
        for local_rank, child in self._children.items():
            code = child.poll()
            if code is None or code == 0:
                continue
            how = (f"was killed by {_signal_name(-code)}" if code < 0
                   else f"exited with code {code}")
            error = rank_error(self.workdir, local_rank)
            return f"rank {local_rank} {how}" + (f": {error}" if error else "")
        return None


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"
