"""The site's link to the server (site/connection.py ServerLink.run) against an in-process fake
of the Federation stub: after a reconnect it replays the final job states it sent (one may have
been lost with the old call), and between calls it backs off along BACKOFF_S (each pause a
random point in its step's second half), from the start again once a call got through. The backoff's waits are recorded, never slept."""

from __future__ import annotations

import json
import threading

import grpc
import pytest

from atoll.site import connection
from atoll.site.connection import BACKOFF_S, ServerLink, backoff_s
from atoll.wire import messages as msg

HELLO = {"site": "site-1", "running_jobs": []}


class Broken(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection reset"


class Waits(threading.Event):
    """The link's stop flag: records every backoff wait and returns at once; it stops the link
    after ``limit`` waits."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.waits = limit, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


class Call:
    def __init__(self, commands):
        self.commands = commands

    def __iter__(self):
        yield from self.commands
        raise Broken()

    def cancel(self):
        pass


class Stub:
    """Each Connect takes ``reads`` events of the site's stream (as the server would) and
    answers with ``commands``, then the call breaks."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = []  # the events each call received, decoded

    def Connect(self, events):
        reads, commands = self.script.pop(0)
        taken = []
        for _ in range(reads):
            event = next(events)
            kind = event.WhichOneof("kind")
            taken.append((kind, json.loads(getattr(event, kind))))
        self.calls.append(taken)
        return Call(commands)


WELCOME = msg.ServerCommand(welcome="{}")


def link_for(stub: Stub, waits: int, on_command=lambda kind, body: None) -> ServerLink:
    link = ServerLink(channel=None, stub=stub, hello=lambda: dict(HELLO), on_command=on_command)
    link._wait_for_server = lambda: True  # no channel: the fake stub is the server
    link._stop = Waits(waits)
    return link


def test_final_states_are_replayed_on_every_new_call_and_others_are_not():
    stub = Stub([(4, [WELCOME]), (2, [WELCOME])])
    link = link_for(stub, waits=2)
    link.send_state("a" * 32, "RUNNING")
    link.send_state("a" * 32, "FINISHED:COMPLETED", "done")
    link.run()

    final = ("job_state", {"job_id": "a" * 32, "state": "FINISHED:COMPLETED", "reason": "done"})
    running = ("job_state", {"job_id": "a" * 32, "state": "RUNNING", "reason": ""})
    first, second = stub.calls
    assert first == [("hello", HELLO), final, running, final]
    # the server may have lost the report with the first call: the next one sends it again,
    # and the RUNNING it superseded is not sent again
    assert second == [("hello", HELLO), final]


def test_only_the_newest_final_states_are_kept_for_replay(monkeypatch):
    monkeypatch.setattr(connection, "KEEP_FINAL", 2)
    stub = Stub([(3, [])])
    link = link_for(stub, waits=1)
    for job in "abc":
        link.send_state(job * 32, "FINISHED:FAILED", f"job {job} failed")
    link.run()
    [[hello, *replayed]] = stub.calls
    assert hello == ("hello", HELLO)
    assert [body["job_id"] for _, body in replayed] == ["b" * 32, "c" * 32]


def test_backoff_grows_to_its_ceiling_and_starts_again_after_a_call_got_through():
    got = []
    dispatch = msg.ServerCommand(dispatch=json.dumps({"job_id": "d" * 32}))
    failing = [(1, [])] * 6
    stub = Stub([*failing, (1, [WELCOME, dispatch]), (1, [])])
    link = link_for(stub, waits=8, on_command=lambda kind, body: got.append((kind, body)))
    link.run()
    # up to its ceiling, held there, and from the start again once a call got through
    steps = [0.2, 0.5, 1.0, 2.0, 5.0, 5.0, 0.2, 0.5]
    assert len(link._stop.waits) == len(steps)
    assert all(step / 2 <= wait <= step for wait, step in zip(link._stop.waits, steps, strict=True))
    assert BACKOFF_S == (0.2, 0.5, 1.0, 2.0, 5.0)
    assert got == [("dispatch", {"job_id": "d" * 32})]  # the welcome is the link's own
    assert not link.connected.is_set()  # the last call broke
    assert len(stub.calls) == 8


def test_sites_that_lose_the_server_together_do_not_come_back_together():
    # a server restart breaks every site's link at once: at fixed steps they would all dial
    # again in the same instant and time the server's TLS handshakes out
    pauses = [backoff_s(attempt) for attempt in (0, 3) for _ in range(1000)]
    first, fourth = pauses[:1000], pauses[1000:]
    assert 0.1 <= min(first) < 0.11 and 0.19 < max(first) <= 0.2
    assert 1.0 <= min(fourth) < 1.1 and 1.9 < max(fourth) <= 2.0
    assert len(set(first)) > 900


@pytest.mark.parametrize("text", ["not json", "[1, 2]"])
def test_a_command_that_is_not_a_json_object_is_ignored_and_the_link_stays_up(text):
    got = []
    stub = Stub([(1, [WELCOME, msg.ServerCommand(abort=text),
                      msg.ServerCommand(end=json.dumps({"job_id": "e" * 32}))])])
    link = link_for(stub, waits=1, on_command=lambda kind, body: got.append((kind, body)))
    link.run()
    assert got == [("end", {"job_id": "e" * 32})]


@pytest.mark.parametrize(("welcome", "period"), [
    ({"heartbeat_s": 50.0}, 50.0),  # a large federation's server asks for fewer
    ({"heartbeat_s": 1e9}, connection.HEARTBEAT_BOUNDS_S[1]),  # the server's word, bounded
    ({"heartbeat_s": 0.001}, connection.HEARTBEAT_BOUNDS_S[0]),
    ({"heartbeat_s": "often"}, connection.HEARTBEAT_S),
    ({"heartbeat_s": True}, connection.HEARTBEAT_S),
    ({"heartbeat_s": float("nan")}, connection.HEARTBEAT_S),
    ({}, connection.HEARTBEAT_S),
])
def test_the_welcome_sets_the_heartbeat_within_bounds(welcome, period):
    stub = Stub([(1, [msg.ServerCommand(welcome=json.dumps(welcome))])])
    link = link_for(stub, waits=1)
    link.run()
    assert link.heartbeat_s == period
