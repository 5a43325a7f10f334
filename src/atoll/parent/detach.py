"""The CLI's control of a parent in the background: start detached, wait until ready, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from atoll.parent.pidfile import alive, pid_file, read_pid


def start_detached(role: str, kit: Path, workspace: Path, timeout: float = 30.0) -> int:
    """Start the `role` parent of `kit` (atoll.parent.run) in its own session; wait until it
    is ready."""
    from atoll.parent.run import command  # the parent's own entry; it imports none of this
    from atoll.pki.files import append_private, private_dir

    private_dir(workspace)
    ready = workspace / f"{role}.ready"
    ready.unlink(missing_ok=True)
    log_path = workspace / f"{role}.log"
    with open(append_private(log_path), "ab") as log:  # 0600: it may quote the parent's config
        child = subprocess.Popen(
            command(role, kit, ready), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
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
    """SIGTERM the parent recorded in the workspace; SIGKILL it if it does not go in time."""
    pid = read_pid(workspace, role)
    if pid is None:
        pid_file(workspace, role).unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.02)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    pid_file(workspace, role).unlink(missing_ok=True)
    return True
