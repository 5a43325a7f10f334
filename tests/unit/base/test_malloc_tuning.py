"""Parents and job workers keep free memory at the top of their heap (base/malloc_tuning.py):
a process that frees a 1 MiB frame and takes the next one reuses the pages instead of faulting
them in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from atoll.base.malloc_tuning import TOP_PAD_BYTES

PROBE = r"""
import resource, sys
from atoll.base.malloc_tuning import tune_for_streaming
if not tune_for_streaming(top_pad=int(sys.argv[1])):
    print("no-mallopt")
    raise SystemExit
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
frame = b"x" * (1 << 20)  # one 1 MiB frame at the top of the heap, written to its last page
del frame
before = faults()
for _ in range(50):  # a relay's steady state: take a frame, fill it, let it go
    frame = b"x" * (1 << 20)
    del frame
print(faults() - before)
"""


def _faults(top_pad: int) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, str(top_pad)], capture_output=True,
                         text=True, check=True, timeout=60).stdout.strip()
    if out == "no-mallopt":
        pytest.skip("this C library has no mallopt (not glibc)")
    return int(out)


def test_a_padded_heap_takes_a_frame_after_the_last_without_faulting_its_pages_in():
    unpadded, padded = _faults(0), _faults(TOP_PAD_BYTES)
    pages_per_frame = (1 << 20) // 4096
    assert unpadded >= 25 * pages_per_frame  # glibc gave the top back after (nearly) each frame
    assert padded < pages_per_frame  # the 50 frames reused the pages of the first


ARENAS = r"""
import ctypes, sys, threading
from atoll.base.malloc_tuning import one_arena
if sys.argv[1] == "one" and not one_arena():
    print("no-mallopt", file=sys.stderr)
    raise SystemExit
def allocate():  # a timer's thread at a parent's start, then gRPC's: each allocates
    blocks = [bytearray(100_000) for _ in range(20)]
    del blocks
for _ in range(3):
    thread = threading.Thread(target=allocate)
    thread.start()
    thread.join()
ctypes.CDLL(None).malloc_stats()  # to stderr: "Arena N:" for each of the process's arenas
"""


def _arenas(setting: str) -> int:
    err = subprocess.run([sys.executable, "-c", ARENAS, setting], capture_output=True,
                         text=True, check=True, timeout=60).stderr
    if "no-mallopt" in err:
        pytest.skip("this C library has no mallopt (not glibc)")
    return sum(line.startswith("Arena ") for line in err.splitlines())


def test_one_arena_set_before_the_second_thread_keeps_every_thread_in_the_main_one():
    """A parent sets it first thing (parent/run.py): a thread that allocated before it had an
    arena of its own, which gRPC's threads then shared, and a parent's growth over 100 MB
    round trips went from 21 to 33-36 MiB (make bench)."""
    assert _arenas("default") >= 2  # what a parent's first timer thread did
    assert _arenas("one") == 1
