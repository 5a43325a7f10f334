"""A parent's pid file in its workspace: written at start, read by `stop` and by a second start."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def pid_file(workspace: Path, role: str) -> Path:
    return workspace / f"{role}.pid"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a detached parent that exited is a zombie until init reaps it: that is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def recorded_pid(workspace: Path, role: str) -> int | None:
    """The pid the file names, alive or not."""
    try:
        return int(json.loads(pid_file(workspace, role).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def read_pid(workspace: Path, role: str) -> int | None:
    """The pid of the running parent, None when the file is absent or names a dead process."""
    pid = recorded_pid(workspace, role)
    # our own pid is no other parent: the file of a killed parent whose container started
    # again in its Pod, where each is PID 1 (an OOM kill), names the one now asking
    return pid if pid is not None and pid != os.getpid() and alive(pid) else None


def write_pid(workspace: Path, role: str) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    pid_file(workspace, role).write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))


def remove_own(workspace: Path, role: str, pid: int) -> bool:
    """Remove the pid file only if it still names ``pid``: a parent that outlived its
    workspace's restart (or the CLI stopping it) must never remove its successor's file."""
    if recorded_pid(workspace, role) != pid:
        return False
    pid_file(workspace, role).unlink(missing_ok=True)
    return True
