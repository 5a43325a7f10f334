"""A worker dies with its parent: it must never train on, orphaned, holding a GPU."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from atoll.spec.errors import EXIT_PARENT_DIED

PR_SET_PDEATHSIG = 1


def tie_to_parent(parent_pid: int | None) -> None:
    if parent_pid is None:
        return  # containers and batch jobs: the parent link itself is the lifeline
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(EXIT_PARENT_DIED)  # the parent died before we could tie ourselves to it

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(EXIT_PARENT_DIED)
            time.sleep(0.5)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
