"""/proc readings for the scale run: the server parent's and its job workers' RSS and CPU."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_s(pid: int) -> float:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        pass
    return out


class Sampler:
    """The server parent's and its job workers' RSS and CPU, sampled at 5 Hz in a thread."""

    def __init__(self, pid: int):
        self.pid = pid
        self.rows: list[tuple[float, int, float, int, float]] = []  # t, rss, cpu, wrss, wcpu
        self._worker_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sampler")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.rows.append(self.sample())

    def sample(self) -> tuple[float, int, float, int, float]:
        workers = children(self.pid)
        for w in workers:  # a worker's CPU stays counted after it exits
            self._worker_cpu[w] = max(self._worker_cpu.get(w, 0.0), cpu_s(w))
        return (
            time.time(),
            rss(self.pid),
            cpu_s(self.pid),
            sum(rss(w) for w in workers),
            sum(self._worker_cpu.values()),
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, t0: float, t1: float) -> dict:
        """CPU seconds used and peak RSS between t0 and t1 (parent and workers)."""
        rows = [r for r in self.rows if t0 <= r[0] <= t1]
        if len(rows) < 2:
            return {}
        first, last = rows[0], rows[-1]
        span = last[0] - first[0]
        return {
            "seconds": span,
            "server_cpu_s": last[2] - first[2],
            "server_cpu_pct": 100 * (last[2] - first[2]) / span if span else 0.0,
            "server_rss_peak": max(r[1] for r in rows),
            "worker_cpu_s": last[4] - first[4],
            "worker_rss_peak": max(r[3] for r in rows),
        }
