"""Keep a long-lived parent's memory flat while multi-megabyte payload chunks pass through it.

glibc raises its mmap threshold after large blocks are freed, so later chunks land in per-thread
heap arenas (one per gRPC thread) and their memory is kept, not returned: a parent's RSS then
grew by a hundred MiB or more while relaying a 100 MB payload. A fixed threshold stops that
drift, and two arenas are plenty for parents whose threads mostly wait. The threshold sits above
the 1 MiB frames (and gRPC's buffers for them): at 256 KiB every frame was freshly mmapped and
faulted in page by page, a third of a relaying parent's CPU time for a 1 GiB model; from the
two arenas the same blocks are reused instead.
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 8 * 1024 * 1024


def tune_for_streaming() -> bool:
    """Apply the settings above; False where the C library has no mallopt (not glibc)."""
    try:
        # The running interpreter's own symbols: libc is already loaded. (ctypes.util's
        # find_library would run ldconfig and import a dozen modules a parent keeps resident.)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    return mallopt(M_ARENA_MAX, 2) == 1 and ok
