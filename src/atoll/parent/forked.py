"""Running one function in a forked child, so that what it imports stays out of this process.

A long-lived parent validates its files at start with pydantic and PyYAML; done in a child,
none of that stays resident in the parent (see local_config.py).
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def run_forked(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a forked child: its result, or the exception it raised, comes back.

    Only while this process runs a single thread (a parent at start): a fork taken while other
    threads hold locks can hang the child. Otherwise ``fn`` runs in this process.
    """
    return start_forked(fn, *args).result()


class Forked(Generic[T]):
    """A call running in a forked child; ``result()`` waits for it (from any thread)."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]):
        self._name = getattr(fn, "__name__", repr(fn))
        self._lock = threading.Lock()
        self._answer: tuple[bool, Any] | None = None
        self._pid = 0
        self._read_fd = -1
        if not _single_threaded():
            self._answer = _call(fn, args)
            return
        self._read_fd, write_fd = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # the child never returns into the caller's frames
            code = 1
            try:
                os.close(self._read_fd)
                data = _dumps(_call(fn, args))
                with os.fdopen(write_fd, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)

    def result(self) -> T:
        with self._lock:
            if self._answer is None:
                with os.fdopen(self._read_fd, "rb") as pipe:
                    data = pipe.read()
                _, status = os.waitpid(self._pid, 0)
                if not data:
                    self._answer = (False, RuntimeError(
                        f"{self._name} ended without an answer in a forked child "
                        f"(exit status {os.waitstatus_to_exitcode(status)})"))
                else:
                    self._answer = pickle.loads(data)
        ok, value = self._answer
        if ok:
            return value
        raise value


def start_forked(fn: Callable[..., T], *args: Any) -> Forked[T]:
    """Start ``fn(*args)`` in a forked child and go on; take its answer with ``result()``."""
    return Forked(fn, args)


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except Exception as exc:  # noqa: BLE001 - handed to whoever takes the result
        return False, exc


def _dumps(answer: tuple[bool, Any]) -> bytes:
    try:
        return pickle.dumps(answer)
    except Exception as exc:  # noqa: BLE001 - e.g. an exception that cannot be pickled
        return pickle.dumps((False, RuntimeError(f"{answer[1]!r} ({exc})")))


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: assume the worst
        return False
