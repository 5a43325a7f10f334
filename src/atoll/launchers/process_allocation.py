"""Which GPUs and CPUs of this host a process-launched worker gets (the Docker launcher reserves
its containers' GPU ids with the same GpuAllocator).

GPUs are exclusive: never two jobs on one GPU; a job that finds too few free GPUs is refused
with the ids in use (the site's admission should not let that happen, this is the last guard).
CPUs are pinned, not reserved: a job gets the ``num_of_cpus`` least-used CPUs (ties: lowest
number first), so jobs get CPUs of their own while there are enough and share the least-loaded
ones after that. Both allocators belong to one launcher instance and are thread-safe.

"Least-used" counts every worker that this user's atoll parents have pinned on this host
(HostCpuLeases), not only the launcher's own: the parents of a local federation (a server and
its sites on one machine) each have a launcher, and counting alone they all pinned their workers
to CPU 0 while the other CPUs stayed idle.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import stat
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from atoll.launchers.base import LaunchError


class GpuAllocator:
    """Exclusive GPU ids, handed out in the order the site listed them."""

    def __init__(self, ids: Iterable[str], where: str = "process.gpu_ids") -> None:
        self._ids = [str(i) for i in ids]
        self._where = where
        self._owner: dict[str, str] = {}
        self._lock = threading.Lock()

    def _check(self, count: int) -> None:
        if count > len(self._ids):
            listed = ", ".join(self._ids) or "none"
            raise LaunchError(
                f"the job asks for {count} GPU(s); this site lists {len(self._ids)} "
                f"({self._where} in local/site.yaml: {listed})"
            )

    def preview(self, count: int) -> list[str]:
        """The ids a job would get now, without taking them (for render)."""
        self._check(count)
        with self._lock:
            free = [i for i in self._ids if i not in self._owner]
        return free[:count] if len(free) >= count else self._ids[:count]

    def allocate(self, job_key: str, count: int) -> list[str]:
        self._check(count)
        with self._lock:
            free = [i for i in self._ids if i not in self._owner]
            if len(free) < count:
                busy = ", ".join(f"{i} (job {j})" for i, j in self._owner.items())
                raise LaunchError(
                    f"the job asks for {count} GPU(s) but only {len(free)} of this site's "
                    f"{len(self._ids)} are free; in use: {busy}"
                )
            taken = free[:count]
            for gpu in taken:
                self._owner[gpu] = job_key
            return taken

    def release(self, job_key: str) -> None:
        with self._lock:
            for gpu in [g for g, j in self._owner.items() if j == job_key]:
                del self._owner[gpu]

    def claim(self, job_key: str, ids: Iterable[str]) -> None:
        """Mark ``ids`` as held by ``job_key``: a worker an earlier parent launched, taken
        back by this one (site/running_parts.py), still holds them."""
        with self._lock:
            for gpu in (str(i) for i in ids):
                if gpu in self._ids:
                    self._owner[gpu] = job_key

    def in_use(self) -> dict[str, str]:
        with self._lock:
            return dict(self._owner)


class CpuAllocator:
    """CPU pinning: the least-used CPUs of the given set, counting the host's other launchers
    through ``host`` when given."""

    def __init__(self, cpus: Iterable[int], host: HostCpuLeases | None = None) -> None:
        self._cpus = sorted(set(cpus))
        self._load = dict.fromkeys(self._cpus, 0)
        self._jobs: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self._host = host
        self._lease = host.new_lease() if host is not None else ""

    @property
    def cpus(self) -> list[int]:
        return list(self._cpus)

    def _choose(self, count: int, others: Counter[int]) -> list[int]:
        if count > len(self._cpus):
            raise LaunchError(
                f"the job asks for {count} CPU(s); workers of this site may use {len(self._cpus)} "
                f"(CPUs {', '.join(map(str, self._cpus))}; process.cpu_ids in local/site.yaml)"
            )
        load = {c: self._load[c] + others[c] for c in self._cpus}
        return sorted(sorted(self._cpus, key=lambda c: (load[c], c))[:count])

    def _others(self) -> Counter[int]:
        """What the host's other launchers have pinned (nothing when not shared)."""
        return self._host.load(excluding=self._lease) if self._host is not None else Counter()

    def _host_locked(self) -> contextlib.AbstractContextManager[None]:
        return self._host.locked() if self._host is not None else contextlib.nullcontext()

    def _publish(self) -> None:
        if self._host is not None:
            self._host.write(self._lease, [c for cpus in self._jobs.values() for c in cpus])

    def preview(self, count: int) -> list[int]:
        with self._lock:  # lease files are replaced whole: reading needs no host lock
            return self._choose(count, self._others())

    def allocate(self, job_key: str, count: int) -> list[int]:
        with self._lock, self._host_locked():
            chosen = self._choose(count, self._others())
            for cpu in chosen:
                self._load[cpu] += 1
            self._jobs[job_key] = chosen
            self._publish()
            return chosen

    def release(self, job_key: str) -> None:
        with self._lock, self._host_locked():
            for cpu in self._jobs.pop(job_key, []):
                self._load[cpu] -= 1
            self._publish()


class HostCpuLeases:
    """Which CPUs the launchers of this user's parents on this host have pinned workers to: a
    folder of lease files, one per launcher, each the list of CPUs its running workers hold.

    A lease is named after its process (pid and start time), so the lease of a parent that died
    without cleaning up is recognised as stale and removed. The folder must be a real directory
    owned by this user and closed to others; otherwise ``for_host`` returns None and each
    launcher counts alone, as before. The leases only advise: a folder that cannot be read or
    written later (removed, disk full) never fails a launch, the launcher then counts alone.
    """

    _ids = itertools.count(1)

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._me = f"{os.getpid()}-{_start_time(os.getpid())}"

    @classmethod
    def for_host(cls) -> HostCpuLeases | None:
        folder = Path(tempfile.gettempdir()) / f"atoll-{os.getuid()}-cpu-leases"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            info = folder.lstat()
        except OSError:
            return None
        if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077):
            return None
        return cls(folder)

    def new_lease(self) -> str:
        return f"{self._me}-{next(self._ids)}"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        try:
            fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            fd = -1  # unlocked: at worst two launches at once pick the same CPU
        try:
            yield
        finally:
            if fd >= 0:
                os.close(fd)  # releases the lock

    def load(self, excluding: str) -> Counter[int]:
        """How many workers each CPU holds in every live lease but ``excluding``."""
        load: Counter[int] = Counter()
        try:
            paths = list(self.folder.glob("*.lease"))
        except OSError:
            return load
        for path in paths:
            name = path.name.removesuffix(".lease")
            if name == excluding:
                continue
            try:
                if not _alive(name):
                    path.unlink(missing_ok=True)
                    continue
                load.update(int(c) for c in json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue  # half-written by a crash, or not ours: it counts as nothing
        return load

    def write(self, lease: str, cpus: list[int]) -> None:
        path = self.folder / f"{lease}.lease"
        tmp = path.with_suffix(".tmp")
        try:
            if not cpus:
                path.unlink(missing_ok=True)
                return
            tmp.write_text(json.dumps(sorted(cpus)))
            os.replace(tmp, path)
        except OSError:  # the other launchers will not see these CPUs taken: they only advise
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(lease: str) -> bool:
    """Whether the process that wrote this lease is the one still running under its pid."""
    pid, started = lease.split("-")[:2] if lease.count("-") >= 2 else ("", "")
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError):  # gone, or the pid is another user's now
        return False
    return _start_time(int(pid)) == started
