"""atoll admin poller for bench/compare (run with atoll's venv python).

  ctl.py KIT ready N TIMEOUT     -> waits until the server accepts the admin and lists N sites online
  ctl.py KIT wait JOB_ID TIMEOUT -> waits until the job is FINISHED:*; then, outside the time
                                    measured, reads the checkpoint's size from its events
  ctl.py KIT armed-ready|armed-wait  -> the same, armed first (drivers/base.py Watcher): the
                                    imports (and for wait the session's TLS handshake) done, it
                                    prints {"armed": true} and reads "ARG TIMEOUT" from stdin

Both keep one `atoll.admin.session.Session` (one mutual-TLS channel), so the measured time is
atoll's, not the cost of a new `atoll` process per poll. `ready` polls every 0.1 s (atoll has no
call that waits for sites); `wait` follows the job as `atoll job submit --wait` does, with the
server answering each change as it happens (since 2026-12-06; before, it polled every 0.1 s).
Until the server's port accepts a TCP connection the session is not created: a gRPC channel
that failed to connect backs off for a second or more, which would be charged to atoll's
start-up.
"""

from __future__ import annotations

import json
import socket
import sys
import time

from atoll.admin.errors import ConnectionFailed
from atoll.admin.session import Session
from atoll.spec.errors import AtollError

POLL_S = 0.1


def _wait_port(address: str, deadline: float) -> bool:
    host, port = address.rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            time.sleep(POLL_S)
    return False


def _session(kit: str, deadline: float) -> Session | None:
    session = Session(kit, timeout=10)
    if not _wait_port(session.kit.server_address, deadline):
        session.close()
        return None
    return session


def ready(kit: str, expected: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    session = _session(kit, deadline)
    if session is None:
        print(json.dumps({"ready": False, "last": "the server's port never opened"}))
        return 1
    last = ""
    with session:
        while time.monotonic() < deadline:
            try:
                online = [s["name"] for s in session.sites()["sites"] if s["online"]]
            except ConnectionFailed as exc:
                online, last = [], str(exc)
            if len(online) >= expected:
                print(json.dumps({"ready": True, "sites": online, "t": time.time()}))
                return 0
            last = last or f"online: {online}"
            time.sleep(POLL_S)
    print(json.dumps({"ready": False, "last": last}))
    return 1


def wait(kit: str, job_id: str, timeout: float, session: Session | None = None) -> int:
    deadline = time.monotonic() + timeout
    session = session or _session(kit, deadline)
    if session is None:
        print(json.dumps({"finished": False, "last": "the server's port never opened"}))
        return 1
    with session:
        try:  # as `atoll job submit --wait` does: the server answers when the job changes
            status = session.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
        except AtollError as exc:
            print(json.dumps({"finished": False, "last": str(exc)}))
            return 1
        done = time.time()
        print(json.dumps({"finished": True, "status": status["state"], "t": done,
                          "reason": status.get("reason", ""),
                          "checkpoint_bytes": _checkpoint_bytes(session, job_id)}))
        return 0


def _checkpoint_bytes(session: Session, job_id: str) -> int | None:
    """The job's checkpoint on disk: its server worker reports each commit's size (a `checkpoint`
    event; one state file is kept, the last); None when it kept none."""
    sizes = [e["bytes"] for e in session.logs(job_id).get("events", [])
             if e.get("event") == "checkpoint" and isinstance(e.get("bytes"), int)]
    return max(sizes) if sizes else None


def main() -> int:
    kit, verb = sys.argv[1], sys.argv[2]
    session = None
    if verb.startswith("armed-"):
        verb = verb.removeprefix("armed-")
        if verb == "wait":  # connected now: the job's time is not the handshake's
            session = _session(kit, time.monotonic() + 60)
            if session is not None:
                session.sites()
        print(json.dumps({"armed": True}), flush=True)
        arg, timeout = sys.stdin.readline().split()
    else:
        arg, timeout = sys.argv[3], sys.argv[4]
    if verb == "ready":
        return ready(kit, int(arg), float(timeout))
    if verb == "wait":
        return wait(kit, arg, float(timeout), session)
    print(f"ctl.py: unknown verb {verb!r} (use ready, wait)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
