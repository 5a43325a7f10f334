"""Flower Control API poller for bench/compare (run with the Flower venv's python).

  ctl.py ready N TIMEOUT   -> waits until the SuperLink answers and N SuperNodes are online
  ctl.py wait RUN_ID TIMEOUT -> waits until the run is finished, prints its final status
  ctl.py armed-ready|armed-wait -> the same, armed first (drivers/base.py Watcher): the imports
                              (and for wait the connection) done, it prints {"armed": true}
                              and reads "ARG TIMEOUT" from stdin

Both poll every 0.1 s over one kept connection, so the measured time is Flower's, not the
cost of starting a new `flwr` process for every poll. The connection is the "bench" entry of
$FLWR_HOME/config.toml written by the driver.
"""

from __future__ import annotations

import json
import sys
import time

from flwr.cli.flower_config import read_superlink_connection
from flwr.cli.utils import init_http_client_from_connection
from flwr.proto.control_pb2 import ListNodesRequest, ListRunsRequest  # noqa: E0611

POLL_S = 0.1


def _client():
    return init_http_client_from_connection(read_superlink_connection("bench"))


def ready(expected: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    client = None
    last = ""
    while time.monotonic() < deadline:
        try:
            client = client or _client()
            res = client.ListNodes(ListNodesRequest())
            online = [n for n in res.nodes_info if n.status == "online"]
            if len(online) >= expected:
                print(json.dumps({"ready": True, "online": len(online), "t": time.time()}))
                return 0
            last = f"{len(online)} online"
        except Exception as exc:  # the SuperLink may not listen yet
            last = f"{type(exc).__name__}: {exc}"
            client = None
        time.sleep(POLL_S)
    print(json.dumps({"ready": False, "last": last}))
    return 1


def wait(run_id: int, timeout: float, client=None) -> int:
    client = client or _client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = client.ListRuns(ListRunsRequest(run_id=run_id))
        run = res.run_dict[run_id]
        if run.status.status == "finished":
            print(
                json.dumps(
                    {
                        "finished": True,
                        "t": time.time(),
                        "status": f"{run.status.status}:{run.status.sub_status}",
                        "details": run.status.details,
                    }
                )
            )
            return 0
        time.sleep(POLL_S)
    print(json.dumps({"finished": False}))
    return 1


def main() -> int:
    verb = sys.argv[1]
    client = None
    if verb.startswith("armed-"):
        verb = verb.removeprefix("armed-")
        if verb == "wait":  # connected now: the run's time is not the connection's
            client = _client()
            client.ListRuns(ListRunsRequest())
        print(json.dumps({"armed": True}), flush=True)
        arg, timeout = sys.stdin.readline().split()
    else:
        arg, timeout = sys.argv[2], sys.argv[3]
    if verb == "ready":
        return ready(int(arg), float(timeout))
    if verb == "wait":
        return wait(int(arg), float(timeout), client)
    print(f"ctl.py: unknown verb {verb!r} (use ready, wait)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
