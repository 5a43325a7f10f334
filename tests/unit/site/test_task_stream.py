"""A job's pulls and replies on one call to the server (site/task_stream.py), against a small
Federation service on a real gRPC server: one call for many rounds; a task or an answer out of
the stream's shape refused, and the next use opens a new call; a second operation at once goes
as a call of its own; closing the stream frees a pull that waits."""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
import pytest

from atoll.site.task_stream import TaskStream
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.grpc_setup import new_server


class Server:
    """Serves tasks on Tasks and PullTask; `misbehave` names what to get wrong. It answers a
    call opened `compact` as the server does (an ack with the next task's header, a small
    payload inline), unless `old` (a server from before compact calls)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.replies: list[tuple[dict, list[bytes]]] = []
        self.misbehave = ""
        self.old = False
        self.hold = threading.Event()  # a pull waits for it when misbehave == "hold"
        self.rounds = 0
        self.pulls_ahead = 0  # replies that asked for the next task
        self.sized = 0  # replies that said their size
        self.inline = 0  # replies whose payload came inline
        self.received = 0  # messages after the call's first
        self.sent = 0

    def _task(self) -> list[bytes]:
        self.rounds += 1
        return [frames.header({"task_id": f"t{self.rounds}", "topic": "train",
                               "headers": {"round": self.rounds}}),
                frames.data(b"x" * self.rounds)]

    def Tasks(self, request_iterator, context):
        self.calls["Tasks"] += 1
        requests = iter(request_iterator)
        opener = frames.read_header(next(requests))
        assert opener == {"job_id": "j1", "compact": True}
        compact = not self.old
        for out in self._serve(requests, compact):
            self.sent += 1
            yield out

    def _serve(self, requests, compact: bool):
        for raw in requests:
            self.received += 1
            head, inline = frames.read_message(raw)
            ack = {}
            if "reply" in head:
                data = []
                if inline is not None:  # its payload in the header's message
                    assert head["bytes"] == len(inline)
                    data, self.inline = [frames.data(inline)], self.inline + 1
                elif "bytes" in head:  # its size known: no {sent}
                    while sum(map(len, data)) < head["bytes"]:
                        data.append(next(requests))
                        self.received += 1
                else:
                    while frames.is_data(raw := next(requests)):
                        data.append(raw)
                        self.received += 1
                    self.received += 1
                self.sized += "bytes" in head
                self.replies.append((head["reply"], data))
                if "bytes" not in head:
                    head = frames.read_header(raw)  # {sent: true}, and the pull it asks for
                self.pulls_ahead += "pull" in head  # counted before the ack the test waits on
                answer = {"ack": {}} if self.misbehave != "no ack" else {"ok": 1}
                if self.misbehave == "ack inline":
                    yield frames.header(answer, b"x")
                    continue
                if not compact or "pull" not in head:
                    yield frames.header(answer)
                    if "pull" not in head:
                        continue
                else:
                    ack = answer
            if self.misbehave == "hold":
                self.hold.wait(10)
            if self.misbehave == "end":
                yield frames.header({**ack, "end": True})
                return
            first, data = self._task()
            task = {**ack, **frames.read_header(first)}
            if self.misbehave == "no done":
                yield from (frames.header(task), data, frames.header({"task_id": "t9"}))
            elif self.misbehave == "too few":
                yield from (frames.header({**task, "frames": 2}), data)
                yield frames.header({"ack": {}})
            elif self.misbehave == "inline size":
                yield frames.header({**task, "bytes": self.rounds + 1}, b"x" * self.rounds)
            elif compact:
                yield frames.header({**task, "bytes": self.rounds}, b"x" * self.rounds)
            elif self.rounds % 2:  # a payload still arriving: up to {done}
                yield from (frames.header(task), data, frames.header({"done": True}))
            else:  # a whole one: its number of frames
                yield from (frames.header({**task, "frames": 1}), data)

    def PullTask(self, request, context):
        self.calls["PullTask"] += 1
        yield from self._task()

    def PushReply(self, request_iterator, context):
        self.calls["PushReply"] += 1
        head, payload = frames.split(iter(request_iterator))
        self.replies.append((head, list(payload.frames())))
        return msg.Json(body='{"stale": true}')

    def Connect(self, request_iterator, context):
        yield from ()

    def FetchJob(self, request, context):
        yield from ()

    def Report(self, request, context):
        return msg.Json(body="{}")


@pytest.fixture
def served():
    service = Server()
    server = new_server(8)
    rpc.add_servicer(server, "Federation", service)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield service, rpc.stub(channel, "Federation")
    service.hold.set()
    channel.close()
    server.stop(0)


def _round(stream: TaskStream, n: int | None, sized: bool = False) -> dict:
    """One pull and its reply (`sized`: saying its size); n: the task's number, where the test
    knows it."""
    got = list(stream.pull(5))
    head = frames.read_header(got[0])
    n = n or int(head["task_id"][1:])
    assert head["task_id"] == f"t{n}" and got[1:] == [frames.data(b"x" * n)]
    data = [frames.data(b"reply")]
    return stream.reply({"job_id": "j1", "task_id": head["task_id"], "headers": {"round": n}},
                        iter(data), sum(map(len, data)) if sized else None)


def test_rounds_go_on_one_call(served):
    service, stub = served
    service.old = True  # every shape a server may send: tasks in frames, acks on their own
    stream = TaskStream(stub, "j1")
    for n in (1, 2, 3, 4, 5, 6):  # tasks ended by {done} and by their number of frames;
        assert _round(stream, n, sized=n > 4) == {}  # replies ended by {sent} and sized
    assert service.calls == {"Tasks": 1}
    assert service.pulls_ahead == 6  # each reply asked for the next task: one message less
    assert service.sized == 2
    assert service.inline == 0  # a server that sent nothing inline gets nothing inline
    assert service.replies == [({"task_id": f"t{n}", "headers": {"round": n}},
                                [frames.data(b"reply")]) for n in (1, 2, 3, 4, 5, 6)]
    stream.close()


def test_with_a_compact_server_a_round_is_one_message_each_way(served):
    service, stub = served
    stream = TaskStream(stub, "j1")
    for n in (1, 2, 3, 4):
        assert _round(stream, n, sized=True) == {}
    assert service.calls == {"Tasks": 1}
    # the first pull, then each reply with its payload inline, asking for the next task
    assert (service.received, service.inline) == (1 + 4, 4)
    # each task's header with its payload, the ack of the reply before it in the same message
    assert service.sent == 1 + 4
    assert service.replies == [({"task_id": f"t{n}", "headers": {"round": n}},
                                [frames.data(b"reply")]) for n in (1, 2, 3, 4)]
    stream.close()


@pytest.mark.parametrize("wrong", ["no done", "no ack", "too few", "inline size", "ack inline"])
def test_a_server_out_of_the_streams_shape_is_refused_and_the_next_use_opens_a_new_call(
        served, wrong):
    service, stub = served
    service.old = wrong in ("no done", "too few")
    stream = TaskStream(stub, "j1")
    service.misbehave = wrong
    with pytest.raises(frames.FrameError):
        _round(stream, 1)
    _a_round_on_a_new_call(service, stream)


def test_after_the_servers_end_the_next_pull_opens_a_new_call(served):
    service, stub = served
    stream = TaskStream(stub, "j1")
    service.misbehave = "end"
    assert [frames.read_header(raw) for raw in stream.pull(1)] == [{"end": True}]
    _a_round_on_a_new_call(service, stream)


def _a_round_on_a_new_call(service: Server, stream: TaskStream) -> None:
    service.misbehave, service.old = "", False
    assert _round(stream, None) == {}
    assert service.calls == {"Tasks": 2}
    stream.close()


def test_a_second_operation_at_once_goes_as_a_call_of_its_own(served):
    service, stub = served
    stream = TaskStream(stub, "j1")
    service.misbehave = "hold"
    pulled: list[bytes] = []
    puller = threading.Thread(target=lambda: pulled.extend(stream.pull(5)))
    puller.start()
    while service.calls["Tasks"] == 0:
        time.sleep(0.01)
    time.sleep(0.1)  # the pull holds the stream
    answer = stream.reply({"job_id": "j1", "task_id": "t0", "headers": {}},
                          iter([frames.data(b"r")]))
    assert answer == {"stale": True}  # PushReply's answer, not the stream's
    assert service.calls["PushReply"] == 1
    service.hold.set()
    puller.join(10)
    assert frames.read_header(pulled[0])["task_id"] == "t1"


def test_closing_the_stream_frees_a_pull_that_waits(served):
    service, stub = served
    stream = TaskStream(stub, "j1")
    service.misbehave = "hold"
    raised: list[BaseException] = []

    def pull() -> None:
        try:
            list(stream.pull(5))
        except grpc.RpcError as exc:
            raised.append(exc)

    puller = threading.Thread(target=pull)
    puller.start()
    while service.calls["Tasks"] == 0:
        time.sleep(0.01)
    stream.close()
    puller.join(5)
    assert not puller.is_alive()
    assert raised and raised[0].code() == grpc.StatusCode.CANCELLED


def test_a_reply_before_the_next_pull_goes_as_a_call_of_its_own(served):
    """After a reply the stream has asked for the next task; a second reply (a worker that took
    two tasks) cannot wait behind that task, so it takes a call of its own."""
    service, stub = served
    stream = TaskStream(stub, "j1")
    first = frames.read_header(list(stream.pull(5))[0])
    second = frames.read_header(list(stream.pull(5))[0])
    for head in (first, second):
        answer = stream.reply({"job_id": "j1", "task_id": head["task_id"], "headers": {}},
                              iter([frames.data(b"r")]))
        assert answer == ({} if head is first else {"stale": True})
    assert service.calls == {"Tasks": 1, "PushReply": 1}
    assert frames.read_header(list(stream.pull(5))[0])["task_id"] == "t3"  # asked for ahead
    assert service.calls == {"Tasks": 1, "PushReply": 1}
    stream.close()
