"""Keep a process's memory flat, and its pages reused, while multi-megabyte payload chunks pass.

glibc raises its mmap threshold after large blocks are freed, so later chunks land in per-thread
heap arenas (one per gRPC thread) and their memory is kept, not returned: a parent's RSS then
grew by a hundred MiB or more while relaying a 100 MB payload. A fixed threshold stops that
drift. The threshold sits above the 1 MiB frames (and gRPC's buffers for them): at 256 KiB every
frame was freshly mmapped and faulted in page by page.

One arena, and 4 MiB kept free at its top. glibc gives the top of a heap back as soon as more
than 128 KiB of it is free, and a process that frees a 1 MiB frame at the top and allocates the
next one takes the pages back one fault at a time: with the fixed threshold alone, a 1 GiB
stream cost its receiver 150 k page faults and its sender 230 k, and a 1 GiB job's server parent
660 k. With the padding they take a few thousand. With two arenas the padding raised the RSS
growth over 100 MB round trips from about 25 to 32-34 MiB (issue 3 allows 32); with one arena
it reads 21 MiB. The threads that share it are gRPC's and Python's, which take turns anyway.
Parents and job workers all apply this (bench/compare's 1 GiB round: 22.3 s -> 14.2 s here).
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
M_TOP_PAD = -2
MMAP_THRESHOLD_BYTES = 8 * 1024 * 1024
TOP_PAD_BYTES = 4 * 1024 * 1024


def _mallopt():
    # The running interpreter's own symbols: libc is already loaded. (ctypes.util's
    # find_library would run ldconfig and import a dozen modules a parent keeps resident.)
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt


def one_arena() -> bool:
    """One heap arena for every thread, set before the process has a second thread: a thread
    that allocates earlier gets an arena of its own, which later threads (gRPC's) then share
    with the main one in turn, and two arenas hold half as much again of the frames a payload
    passes through (a parent's growth over 100 MB round trips: 33-36 MiB, against 21 with one).
    The other settings still come with tune_for_streaming, once the parent has started."""
    try:
        return _mallopt()(M_ARENA_MAX, 1) == 1
    except (OSError, AttributeError):
        return False


def tune_for_streaming(top_pad: int = TOP_PAD_BYTES) -> bool:
    """Apply the settings above, with ``top_pad`` bytes of free memory kept at the top of the
    heap (0: glibc's default); False where the C library has no mallopt (not glibc)."""
    try:
        mallopt = _mallopt()
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    if top_pad:  # else glibc's own default stays
        ok = mallopt(M_TOP_PAD, top_pad) == 1 and ok
    return mallopt(M_ARENA_MAX, 1) == 1 and ok
