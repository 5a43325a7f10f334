"""FLARE admin poller for bench/compare (run with the FLARE venv's python).

  ctl.py KIT ready N TIMEOUT   -> waits until the server accepts the admin and sees N clients
  ctl.py KIT wait JOB_ID TIMEOUT -> waits until the job is in a terminal state
  ctl.py KIT armed-ready|armed-wait -> the same, armed first (drivers/base.py Watcher): the
                                  imports (and for wait the admin login) done, it prints
                                  {"armed": true} and reads "ARG TIMEOUT" from stdin

Both keep one admin session (FLARE's own Session API) and poll every 0.1 s, so the measured
time is FLARE's, not the cost of a new `nvflare` process per poll. KIT is the admin's
startup kit folder.
"""

from __future__ import annotations

import json
import sys
import time

from nvflare.fuel.flare_api.flare_api import new_secure_session

POLL_S = 0.1
ADMIN = "admin@nvidia.com"


def _session(kit: str, deadline: float):
    last = ""
    while time.monotonic() < deadline:
        try:
            return new_secure_session(
                ADMIN, kit, timeout=max(1.0, min(5.0, deadline - time.monotonic()))
            )
        except Exception as exc:  # the server may not listen yet
            last = f"{type(exc).__name__}: {exc}"
            time.sleep(POLL_S)
    raise TimeoutError(f"no admin session: {last}")


def ready(kit: str, expected: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    try:
        sess = _session(kit, deadline)
    except TimeoutError as exc:
        print(json.dumps({"ready": False, "last": str(exc)}))
        return 1
    try:
        while time.monotonic() < deadline:
            clients = [c.name for c in sess.get_system_info().client_info]
            if len(clients) >= expected:
                print(json.dumps({"ready": True, "clients": clients, "t": time.time()}))
                return 0
            time.sleep(POLL_S)
        print(json.dumps({"ready": False, "last": f"clients: {clients}"}))
        return 1
    finally:
        sess.close()


def wait(kit: str, job_id: str, timeout: float, sess=None) -> int:
    deadline = time.monotonic() + timeout
    sess = sess or _session(kit, deadline)
    try:
        while time.monotonic() < deadline:
            status = sess.get_job_meta(job_id).get("status", "")
            if status.startswith("FINISHED"):
                print(json.dumps({"finished": True, "status": status, "t": time.time()}))
                return 0
            time.sleep(POLL_S)
        print(json.dumps({"finished": False}))
        return 1
    finally:
        sess.close()


def main() -> int:
    kit, verb = sys.argv[1], sys.argv[2]
    sess = None
    if verb.startswith("armed-"):
        verb = verb.removeprefix("armed-")
        if verb == "wait":  # logged in now: the job's time is not the login's
            sess = _session(kit, time.monotonic() + 60)
        print(json.dumps({"armed": True}), flush=True)
        arg, timeout = sys.stdin.readline().split()
    else:
        arg, timeout = sys.argv[3], sys.argv[4]
    if verb == "ready":
        return ready(kit, int(arg), float(timeout))
    if verb == "wait":
        return wait(kit, arg, float(timeout), sess)
    print(f"ctl.py: unknown verb {verb!r} (use ready, wait)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
