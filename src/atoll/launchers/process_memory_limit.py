"""A hard memory limit for one process tree: a cgroup where the host allows it.

Preference: cgroup v2 (``memory.max``, swap off) when the parent's own cgroup delegates the memory
controller; else cgroup v1 (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``) when the
v1 memory hierarchy is writable (root, or a delegated subtree); else nothing here, and the process
launcher falls back to ``RLIMIT_AS`` (see docs/launchers.md). A cgroup is a child of the parent's
own cgroup, named after the job; the kernel's OOM killer ends the job with SIGKILL and we read the
OOM count back to say "out of memory" instead of just "killed".
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from atoll.launchers.base import LaunchError

PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class MemoryCgroup:
    kind: str  # "cgroup-v2" or "cgroup-v1"
    path: Path

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def oom_killed(self) -> bool:
        """Did the kernel's OOM killer act in this cgroup?"""
        name = "memory.events" if self.kind == "cgroup-v2" else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        if self.kind == "cgroup-v1":  # kernels before 4.13 have no oom_kill line
            with contextlib.suppress(OSError, ValueError):
                return int((self.path / "memory.failcnt").read_text()) > 0 and not self.pids()
        return False

    def kill_all(self) -> None:
        """SIGKILL whatever is left in the cgroup (processes that left the process group too)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, attempts: int = 50) -> None:
        """rmdir once the last member has exited (the kernel refuses while it has members)."""
        for _ in range(attempts):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                self.kill_all()
                time.sleep(0.02)


def _own_cgroups() -> dict[str, str]:
    """controller ("" for v2) -> this process's cgroup path."""
    out: dict[str, str] = {}
    for line in PROC_CGROUP.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def _mount_of(fstype: str, option: str | None) -> tuple[str, str] | None:
    """(mount root, mount point) of the cgroup filesystem holding ``option`` (v1) or v2."""
    for line in PROC_MOUNTINFO.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if not rfields or rfields[0] != fstype:
            continue
        if option is None or option in rfields[-1].split(","):
            return fields[3], fields[4]
    return None


def _dir_for(mount: tuple[str, str], path: str) -> Path:
    root, point = mount
    rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
    return Path(point) / ("" if rel == "." else rel)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


_CGROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

def create_memory_cgroup(name: str, limit_bytes: int) -> MemoryCgroup | None:
    """A new cgroup limited to ``limit_bytes``, or None when this host does not allow one.
    ``name`` is one plain folder name (atoll-<site>-<job id>, of checked ids)."""
    if not _CGROUP_NAME.fullmatch(name):
        raise LaunchError(f"{name[:80]!r} is not a cgroup name: use 1-128 letters, digits, '.', "
                          "'_' and '-', starting with a letter or digit")
    try:
        own = _own_cgroups()
    except OSError:
        return None
    for attempt in (_create_v2, _create_v1):
        with contextlib.suppress(OSError, ValueError):
            cgroup = attempt(own, name, limit_bytes)
            if cgroup is not None:
                return cgroup
    return None


def _create_v2(own: dict[str, str], name: str, limit: int) -> MemoryCgroup | None:
    mount = _mount_of("cgroup2", None)
    if mount is None or "" not in own:
        return None
    parent = _dir_for(mount, own[""])
    if not _v2_memory_delegated(parent):
        return None
    path = parent / name
    path.mkdir(exist_ok=True)
    try:
        _write(path / "memory.max", str(limit))
        if (path / "memory.swap.max").exists():
            _write(path / "memory.swap.max", "0")
    except OSError:
        path.rmdir()
        raise
    return MemoryCgroup("cgroup-v2", path)


def _v2_memory_delegated(parent: Path) -> bool:
    """Can job cgroups under ``parent`` have a memory limit?

    cgroup v2 lets a cgroup hand controllers to its children only while it holds no process
    itself. In a delegated cgroup where this parent is alone (``systemd-run --scope -p
    Delegate=yes``), move the parent into a leaf ``atoll-parent`` and enable ``memory`` for
    the job cgroups next to it. Anything else: no (the caller falls back).
    """
    if "memory" in (parent / "cgroup.subtree_control").read_text().split():
        return True
    if "memory" not in (parent / "cgroup.controllers").read_text().split():
        return False
    if (parent / "cgroup.procs").read_text().split() != [str(os.getpid())]:
        return False  # other processes live here: enabling memory would fail, moving them is rude
    leaf = parent / "atoll-parent"
    leaf.mkdir(exist_ok=True)
    _write(leaf / "cgroup.procs", str(os.getpid()))
    _write(parent / "cgroup.subtree_control", "+memory")
    return True


def _create_v1(own: dict[str, str], name: str, limit: int) -> MemoryCgroup | None:
    mount = _mount_of("cgroup", "memory")
    if mount is None or "memory" not in own:
        return None
    path = _dir_for(mount, own["memory"]) / name
    path.mkdir(exist_ok=True)
    try:
        _write(path / "memory.limit_in_bytes", str(limit))
        if (path / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
            _write(path / "memory.memsw.limit_in_bytes", str(limit))
    except OSError:
        path.rmdir()
        raise
    return MemoryCgroup("cgroup-v1", path)
