"""Finds, measures and stops the processes of one benchmarked deployment, from /proc alone.

Every process the harness starts carries BENCH_COMPARE_TAG (this run's token) and
BENCH_COMPARE_ROLE ("deployment" or "admin") in its environment, and every child inherits
them. That finds a system's processes even after they daemonize and are re-parented to init
(FLARE's start scripts do), without psutil and without trusting any pid file.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

TAG_VAR = "BENCH_COMPARE_TAG"
ROLE_VAR = "BENCH_COMPARE_ROLE"
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # start time in clock ticks: (pid, start) names one process for good
    role: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)

    @property
    def cmdline(self) -> str:
        """Read live: a child seen between fork and exec still shows its parent's command."""
        return _cmdline(self.pid)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _environ_tag(pid: int) -> tuple[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    tag = role = None
    for item in env:
        if item.startswith(TAG_VAR.encode() + b"="):
            tag = item.split(b"=", 1)[1].decode()
        elif item.startswith(ROLE_VAR.encode() + b"="):
            role = item.split(b"=", 1)[1].decode()
    return (tag, role or "") if tag else None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def file_rss(pid: int) -> int:
    """The part of a process's RSS that is file-backed (its mappings of files: a handoff file
    being read, the interpreter's and libraries' code), from /proc/PID/smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line and "kB" in line)
        rss = int(fields["Rss"].split()[0])
        anon = int(fields["Anonymous"].split()[0])
        return (rss - anon) * 1024
    except (OSError, KeyError, ValueError):
        return 0


class ProcessTable:
    """Live processes carrying one tag. Untagged pids are remembered so that a 20 Hz scan
    reads only /proc entries it has not seen before."""

    def __init__(self, tag: str):
        self.tag = tag
        self._tagged: dict[int, Proc] = {}
        self._untagged: set[int] = set()
        self._lock = threading.Lock()

    def scan(self, role: str | None = None) -> list[Proc]:
        """Running (not zombie) processes with this tag, optionally of one role."""
        with self._lock:
            pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
            self._untagged &= pids
            for pid in list(self._tagged):
                if pid not in pids:
                    del self._tagged[pid]
            alive: list[Proc] = []
            for pid in pids:
                if pid in self._untagged:
                    continue
                st = _stat(pid)
                if st is None:
                    continue
                state, ppid, start = st
                known = self._tagged.get(pid)
                if known is None or known.start != start:
                    tagged = _environ_tag(pid)
                    if tagged is None or tagged[0] != self.tag:
                        # Our own children may be between fork and exec (old environment):
                        # look at them again next time instead of caching them as untagged.
                        if ppid != os.getpid() and os.path.exists(f"/proc/{pid}"):
                            self._untagged.add(pid)
                        continue
                    known = Proc(pid, start, tagged[1])
                    self._tagged[pid] = known
                if state != "Z" and (role is None or known.role == role):
                    alive.append(known)
            return alive

    def rss_total(self, role: str = "deployment") -> int:
        return sum(rss_bytes(p.pid) for p in self.scan(role))

    def kill_all(self, grace_s: float = 5.0) -> list[str]:
        """SIGTERM every tagged process, SIGKILL what is left after grace_s. Returns
        "pid command" for each process that had to be killed (empty if none was left)."""
        victims = [f"{p.pid} {p.cmdline[:100]}" for p in self.scan()]
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            for p in self.scan():
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while self.scan() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.scan():
                break
        return victims


def label(cmdline: str) -> str:
    """A short name for a deployment's process: its role for atoll's, else its command."""
    words = cmdline.split()
    if words and os.path.basename(words[0]) == "bwrap":
        return "bwrap"
    for needle, name in (("atoll.worker", "worker"), (" server start", "server parent"),
                         (" site start", "site parent"), ("atoll.parent server", "server parent"),
                         ("atoll.parent site", "site parent")):
        if needle in cmdline:
            return name
    return cmdline[:40]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """Samples the summed RSS of a deployment's processes in a thread (default 20 Hz).

    `limit_bytes` is a safety stop: when the sum passes it, `on_limit` is called once (the
    runner kills the deployment) so a peer that balloons cannot take the machine down. So is
    `min_available` (bytes of MemAvailable): the machine is shared, and a run must stop before
    it starves the others, whoever's memory it is.

    Per process it keeps the first and the highest RSS seen (`growth`): a parent that relays a
    model without holding it grows by a few MiB whatever the model's size."""

    def __init__(
        self, table: ProcessTable, hz: float = 20.0, limit_bytes: int | None = None, on_limit=None,
        min_available: int | None = None,
    ):
        self.min_available = min_available
        self.first: dict[int, tuple[str, int]] = {}  # pid -> (label, first RSS seen)
        self.most: dict[int, int] = {}  # pid -> highest RSS seen
        self.low_memory = 0  # MemAvailable when the watchdog stopped the run (0: it did not)
        self.table = table
        self.period = 1.0 / hz
        self.limit_bytes = limit_bytes
        self.on_limit = on_limit
        self.samples: list[tuple[float, int, int]] = []  # (time, total rss, process count)
        # (process, rss, of which file-backed: mapped files and the code) at the highest sum
        self.at_peak: list[tuple[str, int, int]] = []
        self._peak_total = 0
        self.limit_hit = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            procs = self.table.scan("deployment")
            each = [(p, rss_bytes(p.pid)) for p in procs]
            total = sum(rss for _, rss in each)
            for p, rss in each:
                if p.pid not in self.first:
                    self.first[p.pid] = (label(p.cmdline), rss)
                self.most[p.pid] = max(rss, self.most.get(p.pid, 0))
            if self.min_available and not self.limit_hit:
                available = mem_available()
                if available < self.min_available:
                    self.limit_hit, self.low_memory = True, available
                    if self.on_limit:
                        self.on_limit(total)
            self.samples.append((time.time(), total, len(procs)))
            if total > self._peak_total:  # who held what at the peak (read once per new peak)
                self._peak_total = total
                self.at_peak = [(label(p.cmdline), rss, file_rss(p.pid)) for p, rss in each]
            if self.limit_bytes and total > self.limit_bytes and not self.limit_hit:
                self.limit_hit = True
                if self.on_limit:
                    self.on_limit(total)
            self._stop.wait(self.period)

    def growth(self) -> list[tuple[str, int, int, int]]:
        """(label, pid, first RSS, growth to the highest) per process, parents first."""
        rows = [(name, pid, rss, self.most[pid] - rss) for pid, (name, rss) in self.first.items()]
        return sorted(rows, key=lambda r: (r[0] != "server parent", r[0] != "site parent", r[1]))

    @property
    def peak(self) -> int:
        return max((s[1] for s in self.samples), default=0)

    @property
    def median(self) -> int:
        values = sorted(s[1] for s in self.samples)
        return values[len(values) // 2] if values else 0
