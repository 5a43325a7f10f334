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
