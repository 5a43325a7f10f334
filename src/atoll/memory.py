"""Keep a long-lived parent's memory flat while multi-megabyte payload chunks pass through it.

glibc raises its mmap threshold after large blocks are freed, so later 2 MiB chunks land in
per-thread heap arenas (one per gRPC thread) and their memory is kept, not returned: a parent's
RSS then grows by a hundred MiB or more while relaying a 100 MB payload. A fixed threshold keeps
every large block mmapped (returned to the system when freed), and two arenas are plenty for
parents whose threads mostly wait.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 1024


def tune_for_streaming() -> bool:
    """Apply the settings above; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    return mallopt(M_ARENA_MAX, 2) == 1 and ok
