"""Running one function in a forked child, so that what it imports stays out of this process.

A long-lived parent validates its files at start with pydantic and PyYAML; done in a child,
none of that stays resident in the parent (see local_config.py).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_forked(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a forked child: its result, or the exception it raised, comes back.

    Only while this process runs a single thread (a parent at start): a fork taken while other
    threads hold locks can hang the child. Otherwise ``fn`` runs in this process.
    """
    if not _single_threaded():
        return fn(*args)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller's frames
        code = 1
        try:
            os.close(read_fd)
            try:
                answer = (True, fn(*args))
            except Exception as exc:  # noqa: BLE001 - sent to the parent, raised there
                answer = (False, exc)
            try:
                data = pickle.dumps(answer)
            except Exception as exc:  # noqa: BLE001 - e.g. an exception that cannot be pickled
                data = pickle.dumps((False, RuntimeError(f"{answer[1]!r} ({exc})")))
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} ended without an answer in a forked "
                           f"child (exit status {os.waitstatus_to_exitcode(status)})")
    ok, value = pickle.loads(data)
    if ok:
        return value
    raise value


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: assume the worst
        return False
