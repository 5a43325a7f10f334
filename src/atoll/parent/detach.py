"""The CLI's control of a parent in the background: start detached, wait until ready, stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from atoll.parent.pidfile import alive, read_pid, recorded_pid, remove_own


def start_detached(role: str, kit: Path, workspace: Path, timeout: float = 30.0) -> int:
    """Start the `role` parent of `kit` (atoll.parent.run) in its own session; wait until it
    is ready."""
    from atoll.base.files import append_private, private_dir
    from atoll.parent.run import command  # the parent's own entry; it imports none of this

    private_dir(workspace)
    ready = workspace / f"{role}.ready"
    ready.unlink(missing_ok=True)
    log_path = workspace / f"{role}.log"
    # Until the parent's own log takes over (rotated, parent/log_file.py), its output lands here
    with open(append_private(log_path), "ab") as log:  # 0600: it may quote the parent's config
        child = subprocess.Popen(
            command(role, kit, ready, log_file=log_path), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists() and ready.stat().st_size:
            return child.pid
        if child.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{role} exited with code {child.returncode} while starting:\n{tail}")
        time.sleep(0.02)
    child.kill()
    raise RuntimeError(f"{role} was not ready within {timeout:.0f} s; see {log_path}")


def start_many(specs: list[tuple[str, Path, Path]], timeout: float = 30.0) -> list[int]:
    """Start several parents at once, each (role, kit, workspace) as in start_detached, and
    wait for all of them."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        futures = [pool.submit(start_detached, role, kit, ws, timeout) for role, kit, ws in specs]
        return [f.result() for f in futures]


def stop(workspace: Path, role: str, timeout: float = 10.0) -> bool:
    """SIGTERM the parent recorded in the workspace; SIGKILL it if it does not go in time.
    The pid file is removed only while it still names the process stopped (or a dead one)."""
    pid = read_pid(workspace, role)
    if pid is None:
        stale = recorded_pid(workspace, role)
        if stale is not None:
            remove_own(workspace, role, stale)
        return False
    end_processes([pid], timeout)
    remove_own(workspace, role, pid)
    return True


def end_processes(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM each process, then SIGKILL those still there after ``timeout``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def processes_under(root: Path) -> list[int]:
    """This user's atoll processes (parents, workers) that belong to the folder ``root``: an
    argument of their command line, or their working directory, lies under it. Found from
    /proc, so a parent whose pid file was lost or overwritten is found too."""
    root = root.resolve()
    found = []
    me, uid = os.getpid(), os.getuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if not any(a.startswith("atoll.") or a.endswith("/atoll") for a in args):
            continue
        if cwd.is_relative_to(root) or any(_under(a, root) for a in args):
            pid = int(entry.name)
            if alive(pid):
                found.append(pid)
    return found


def _under(arg: str, root: Path) -> bool:
    return arg.startswith("/") and Path(arg).is_relative_to(root)
