"""The process launcher's plumbing around a worker process: what it inherits of the parent's
environment, its process group, and the pipe that hands it its credentials. Plain system
calls, no atoll state."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError

INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


def inherited_env() -> dict[str, str]:
    """The variables a process worker inherits from its parent: ``INHERITED_ENV``, no others.

    The one place a launcher reads the parent's environment: a child process needs PATH and the
    locale of its host. Secret values never come from here (the site parent puts them in the
    request's credentials), nor does any launcher's configuration (the Docker SDK alone reads
    its ``DOCKER_HOST``, the Kubernetes client its kubeconfig).
    """
    return {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}


# A pipe holds 64 KiB before a writer blocks; credentials are written before the worker runs.
MAX_CREDENTIAL_BYTES = 60 * 1024


class CredentialsTooLarge(AtollError, ValueError):
    exit_code = EXIT_INVALID


def signal_text(number: int) -> str:
    """``9`` -> ``signal 9 (SIGKILL)``."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def credentials_pipe(credentials: Any) -> int:
    """The read end of a pipe already holding the credentials as JSON (one read, then EOF)."""
    data = json.dumps(dict(credentials)).encode()
    if len(data) > MAX_CREDENTIAL_BYTES:
        raise CredentialsTooLarge(f"the job's credentials (secret_env values) take {len(data)} "
                                  f"bytes; at most {MAX_CREDENTIAL_BYTES} fit "
                                  "(local/study_runtime.yaml)")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc (Linux)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def wait_group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL is delivered asynchronously: return once no member of the group still runs."""
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        kill_group(pgid, signal.SIGKILL)
        time.sleep(0.01)
