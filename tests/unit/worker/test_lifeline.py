"""A worker dies with its parent (worker/lifeline.py), tried with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from atoll.worker.lifeline import tie_to_parent

WORKER = textwrap.dedent("""
    import os, sys, threading, time
    from atoll.worker.lifeline import tie_to_parent
    tie_to_parent(int(sys.argv[1]))
    names = sorted(t.name for t in threading.enumerate())
    print("tied", os.getpid(), ",".join(names), flush=True)
    time.sleep(300)
""")

# The parent: starts the worker, tells its pid, and waits to be killed.
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())],
                              stdout=open(sys.argv[2], "w"))
    time.sleep(300)
""")


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's reaper may be slow, or absent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(check, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


def test_no_parent_pid_ties_nothing():
    before = {t.name for t in threading.enumerate()}
    tie_to_parent(None)  # containers and batch jobs: the link to the parent is the lifeline
    assert {t.name for t in threading.enumerate()} == before


def test_a_worker_whose_parent_is_already_gone_exits_70():
    done = subprocess.run([sys.executable, "-c", WORKER, "1"], capture_output=True, text=True,
                          timeout=60)  # pid 1 is not its parent: the parent it names is gone
    assert done.returncode == 70
    assert "tied" not in done.stdout


def test_a_worker_dies_when_its_parent_is_killed(tmp_path: Path):
    out = tmp_path / "worker.out"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, WORKER, str(out)])
    try:
        wait_until(lambda: out.exists() and out.read_text().endswith("\n"), "the worker tied")
        _, pid, threads = out.read_text().split()
        worker = int(pid)
        assert "lifeline" in threads.split(",")  # the watcher, besides PR_SET_PDEATHSIG
        assert alive(worker)  # tied, and its parent is alive: it runs on
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not alive(worker), "the orphaned worker ended")
    finally:
        parent.kill()
        parent.wait()
