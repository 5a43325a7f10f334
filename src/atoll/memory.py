"""Keep a long-lived parent's memory flat while multi-megabyte payload chunks pass through it.

glibc raises its mmap threshold after large blocks are freed, so later chunks land in per-thread
heap arenas (one per gRPC thread) and their memory is kept, not returned: a parent's RSS then
grew by a hundred MiB or more while relaying a 100 MB payload. A fixed threshold stops that
drift, and two arenas are plenty for parents whose threads mostly wait. The threshold sits above
the 1 MiB frames (and gRPC's buffers for them): at 256 KiB every frame was freshly mmapped and
faulted in page by page, a third of a relaying parent's CPU time for a 1 GiB model; from the
two arenas the same blocks are reused instead.

A site parent also keeps a little free memory at the top of each heap. glibc gives the top of a
heap back as soon as more than 128 KiB of it is free, and a relay that frees a 1 MiB frame at
the top and allocates the next one takes the pages back one fault at a time: a site parent
took 600-700 k page faults (2.5 GiB of fresh pages) while a job moved a 1 GiB model three times
through it. Keeping 4 MiB of padding cut that to 14-21 k, and the site parents' kernel time by
a third. The server parent does not keep it: there the padding raised the RSS growth over
100 MB round trips from about 26 to 31-33 MiB, past issue 3's 32 MiB (bench/federation.py).
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
M_TOP_PAD = -2
MMAP_THRESHOLD_BYTES = 8 * 1024 * 1024
RELAY_TOP_PAD_BYTES = 4 * 1024 * 1024


def tune_for_streaming(top_pad: int = 0) -> bool:
    """Apply the settings above, with ``top_pad`` bytes of free memory kept at the top of each
    heap; False where the C library has no mallopt (not glibc)."""
    try:
        # The running interpreter's own symbols: libc is already loaded. (ctypes.util's
        # find_library would run ldconfig and import a dozen modules a parent keeps resident.)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    if top_pad:  # else glibc's own default stays
        ok = mallopt(M_TOP_PAD, top_pad) == 1 and ok
    return mallopt(M_ARENA_MAX, 2) == 1 and ok
