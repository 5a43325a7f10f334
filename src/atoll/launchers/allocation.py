"""Which GPUs and CPUs of this host a process-launched worker gets.

GPUs are exclusive: never two jobs on one GPU; a job that finds too few free GPUs is refused
with the ids in use (the site's admission should not let that happen, this is the last guard).
CPUs are pinned, not reserved: a job gets the ``num_of_cpus`` least-used CPUs (ties: lowest
number first), so jobs get CPUs of their own while there are enough and share the least-loaded
ones after that. Both allocators belong to one launcher instance and are thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from atoll.launchers.base import LaunchError


class GpuAllocator:
    """Exclusive GPU ids, handed out in the order the site listed them."""

    def __init__(self, ids: Iterable[str]) -> None:
        self._ids = [str(i) for i in ids]
        self._owner: dict[str, str] = {}
        self._lock = threading.Lock()

    def _check(self, count: int) -> None:
        if count > len(self._ids):
            listed = ", ".join(self._ids) or "none"
            raise LaunchError(
                f"the job asks for {count} GPU(s); this site lists {len(self._ids)} "
                f"(process.gpu_ids in local/site.yaml: {listed})"
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

    def in_use(self) -> dict[str, str]:
        with self._lock:
            return dict(self._owner)


class CpuAllocator:
    """CPU pinning: the least-used CPUs of the given set."""

    def __init__(self, cpus: Iterable[int]) -> None:
        self._cpus = sorted(set(cpus))
        self._load = dict.fromkeys(self._cpus, 0)
        self._jobs: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    @property
    def cpus(self) -> list[int]:
        return list(self._cpus)

    def _choose(self, count: int) -> list[int]:
        if count > len(self._cpus):
            raise LaunchError(
                f"the job asks for {count} CPU(s); workers of this site may use {len(self._cpus)} "
                f"(CPUs {', '.join(map(str, self._cpus))}; process.cpu_ids in local/site.yaml)"
            )
        return sorted(sorted(self._cpus, key=lambda c: (self._load[c], c))[:count])

    def preview(self, count: int) -> list[int]:
        with self._lock:
            return self._choose(count)

    def allocate(self, job_key: str, count: int) -> list[int]:
        with self._lock:
            chosen = self._choose(count)
            for cpu in chosen:
                self._load[cpu] += 1
            self._jobs[job_key] = chosen
            return chosen

    def release(self, job_key: str) -> None:
        with self._lock:
            for cpu in self._jobs.pop(job_key, []):
                self._load[cpu] -= 1
