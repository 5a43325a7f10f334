"""The worker's channels (worker/grpc_channels.py) against a real parent endpoint in this process
(parent/worker_endpoint.py with a small backend): tasks, replies and reports over the link, and
payloads as files when both sides see a handoff folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from atoll.fl import checkpoint
from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.checkpoint_home import held_checkpoint, keep_checkpoint
from atoll.wire.handoff import KEY, HandoffDir
from atoll.wire.worker_link import worker_channel
from atoll.worker.grpc_channels import (
    POLL_S,
    CheckpointHomeError,
    GrpcServerChannel,
    GrpcSiteChannel,
)

JOB = "job-1"
BIG = os.urandom(3 * frames.CHUNK + 5)  # several data frames


def _bytes(chunks) -> bytes:
    return b"".join(bytes(c) for c in chunks)


class _Parent:
    """A parent's backend that plays scripted streams to its worker and keeps what it got."""

    def __init__(self, handoff: HandoffDir | None = None) -> None:
        self.handoff = handoff
        self.streams: list[list[bytes]] = []  # what the next NextTask/NextReply calls answer
        self.pulls: list[dict[str, Any]] = []
        self.received: list[tuple[str, dict[str, Any], bytes]] = []
        self.reports: list[tuple[str, dict[str, Any]]] = []

    def on_register(self, job_id):
        return {}

    def _payload(self, head, chunks) -> bytes:
        if KEY in head:  # the worker named a file in the handoff folder: read it now
            return _bytes(frames.Payload(self.handoff.take(head[KEY])))
        return _bytes(chunks)

    def send_task(self, job_id, head, chunks):
        self.received.append((job_id, head, self._payload(head, chunks)))
        return {"task_id": f"task-{len(self.received)}"}

    def send_reply(self, job_id, head, chunks):
        self.received.append((job_id, head, self._payload(head, chunks)))
        return {}

    def _next(self, **pull) -> Iterator[bytes]:
        self.pulls.append(pull)
        yield from self.streams.pop(0) if self.streams else [frames.header({"none": True})]

    def next_task(self, job_id, wait_s, as_files=False):
        return self._next(job_id=job_id, wait_s=wait_s, as_files=as_files)

    def next_reply(self, job_id, task_id, wait_s, many=False, as_files=False):
        return self._next(job_id=job_id, task_id=task_id, wait_s=wait_s, many=many,
                          as_files=as_files)

    def report(self, job_id, body):
        self.reports.append((job_id, body))

    job_folder: Path | None = None  # where a Pod's checkpoint is kept (wire/checkpoint_home.py)

    def keep_checkpoint(self, job_id, chunks):
        return keep_checkpoint(chunks, self.job_folder)

    def held_checkpoint(self, job_id):
        return held_checkpoint(self.job_folder)

    def message(self, head: dict[str, Any], data: bytes | None = None) -> list[bytes]:
        """One header-then-data message as the parent sends it: data in a file if it can."""
        if data is not None and self.handoff is not None:
            return [frames.header({**head, KEY: self.handoff.put([data])})]
        return list(frames.payload_frames(head, [data] if data is not None else []))


@pytest.fixture
def link(request, tmp_path: Path) -> Iterator[tuple[_Parent, Any, str, HandoffDir | None]]:
    """(parent backend, the worker's stub, its session, the worker's handoff folder or None)."""
    files = getattr(request, "param", False)
    folder = tmp_path / "handoff"
    parent = _Parent(HandoffDir(folder, create=True) if files else None)
    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, parent, "127.0.0.1", 0)
    channel = worker_channel(endpoint.address, None)
    stub = rpc.stub(channel, "WorkerLink")
    token = tokens.issue(JOB)
    answer = stub.Register(msg.Json(body=json.dumps({"job_id": JOB, "token": token})), timeout=10)
    worker_side = HandoffDir(folder) if files else None
    try:
        yield parent, stub, json.loads(answer.body)["session"], worker_side
    finally:
        channel.close()
        endpoint.stop(0)
        for handoff in (parent.handoff, worker_side):
            if handoff is not None:
                handoff.close()


@pytest.mark.parametrize("link", [False, True], ids=["link", "handoff"], indirect=True)
def test_a_site_receives_its_task_replies_and_reports(link):
    parent, stub, session, handoff = link
    channel = GrpcSiteChannel(stub, session, JOB, "site-1", handoff)
    parent.streams = [
        [frames.header({"none": True})],  # nothing yet: the site asks again
        parent.message({"task_id": "t1", "topic": "train", "headers": {"round": 1}}, BIG),
        [frames.header({"end": True})],
    ]
    task = channel.receive()
    assert (task.task_id, task.topic, task.headers) == ("t1", "train", {"round": 1})
    assert _bytes(task.chunks) == BIG
    channel.reply("t1", {"n": 10}, [b"abc", b"def"])
    channel.report({"event": "metrics", "loss": 0.5})
    assert channel.receive() is None  # the job is over
    [(job, head, data)] = parent.received
    assert job == JOB and data == b"abcdef"
    assert {k: v for k, v in head.items() if k != KEY} == {"task_id": "t1", "headers": {"n": 10}}
    assert (KEY in head) is (handoff is not None)
    assert parent.reports == [(JOB, {"event": "metrics", "loss": 0.5})]
    assert [p["as_files"] for p in parent.pulls] == [handoff is not None] * 3
    assert all(p["job_id"] == JOB and 0 < p["wait_s"] <= POLL_S for p in parent.pulls)


def test_a_site_waiting_past_its_timeout_is_told(link):
    parent, stub, session, _ = link
    channel = GrpcSiteChannel(stub, session, JOB, "site-1")
    with pytest.raises(TimeoutError, match=r"no task from the server within 0.3 s"):
        channel.receive(timeout=0.3)
    assert parent.pulls and all(p["wait_s"] <= 0.3 for p in parent.pulls)


@pytest.mark.parametrize("link", [False, True], ids=["link", "handoff"], indirect=True)
def test_the_server_sends_once_and_gets_every_reply(link, tmp_path):
    parent, stub, session, handoff = link
    channel = GrpcServerChannel(stub, session, JOB, ["site-1", "site-2"], tmp_path, handoff)
    task_id = channel.send(["site-1", "site-2"], "train", {"round": 3}, [BIG])
    assert task_id == "task-1"
    [(job, head, data)] = parent.received
    assert job == JOB and data == BIG
    assert {k: v for k, v in head.items() if k != KEY} == {
        "targets": ["site-1", "site-2"], "topic": "train", "headers": {"round": 3}}
    assert (KEY in head) is (handoff is not None)  # uploaded once, as a file when it can be
    parent.streams = [
        [frames.header({"none": True})],
        parent.message({"site": "site-1", "headers": {"n": 5}}, b"weights-1"),
        [frames.header({"site": "site-2", "error": "site-2 dropped out"})],
    ]
    replies = []
    for reply in channel.replies(task_id):
        replies.append((reply.site, reply.headers, reply.error,
                        None if reply.chunks is None else _bytes(reply.chunks)))
    assert replies == [("site-1", {"n": 5}, None, b"weights-1"),
                       ("site-2", {}, "site-2 dropped out", None)]
    assert len(parent.pulls) == 3  # it stopped asking once both targets answered
    for pull in parent.pulls:
        assert (pull["task_id"], pull["many"], pull["as_files"]) == (
            task_id, True, handoff is not None)


def test_several_replies_come_in_one_stream(link, tmp_path):
    parent, stub, session, _ = link
    channel = GrpcServerChannel(stub, session, JOB, ["a", "b"], tmp_path)
    task_id = channel.send(["a", "b"], "validate", {}, [b"m"])
    parent.streams = [[*frames.payload_frames({"site": "a"}, [b"1" * 10]),
                       *frames.payload_frames({"site": "b"}, [b"2" * 10])]]
    got = [(r.site, _bytes(r.chunks)) for r in channel.replies(task_id)]
    assert got == [("a", b"1" * 10), ("b", b"2" * 10)]
    assert len(parent.pulls) == 1


def test_replies_end_at_the_timeout_without_every_site(link, tmp_path):
    parent, stub, session, _ = link
    channel = GrpcServerChannel(stub, session, JOB, ["a", "b"], tmp_path)
    task_id = channel.send(["a", "b"], "train", {}, [b"m"])
    parent.streams = [list(frames.payload_frames({"site": "a"}, [b"x"]))]
    got = [r.site for r in channel.replies(task_id, timeout=0.5)]
    assert got == ["a"]  # b never answered within the timeout: the caller decides what next


def test_a_channel_without_a_valid_session_is_refused(link):
    parent, stub, _, _ = link
    channel = GrpcSiteChannel(stub, "not-a-session", JOB, "site-1")
    with pytest.raises(grpc.RpcError) as refused:
        channel.report({"event": "x"})
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert parent.reports == []


def test_a_pods_checkpoint_goes_home_and_a_resumed_worker_fetches_it(link, tmp_path):
    """A server worker whose run folder goes with it (a Pod) sends each committed checkpoint
    and its results so far home; the worker started again after a server restart gets them
    back into its own, new run folder."""
    import numpy as np

    parent, stub, session, _ = link
    parent.job_folder = tmp_path / "parent-job"
    parent.job_folder.mkdir()
    pod = tmp_path / "pod"
    channel = GrpcServerChannel(stub, session, JOB, ["site-1"], pod / "results", send_home=True)
    assert channel.fetch_checkpoint() == 0  # nothing held yet
    (pod / "results").mkdir(parents=True)
    (pod / "results" / "metrics.csv").write_text("1,site-1,0.5\n2,site-1,0.25\n")
    checkpoint.save(channel.checkpoint_dir, 2, {"w": np.ones(3)})
    channel.checkpoint_committed(2)
    assert not (pod / "checkpoint-home.zip").exists()  # the worker's copy of the zip is gone

    resumed = tmp_path / "resumed-pod"
    again = GrpcServerChannel(stub, session, JOB, ["site-1"], resumed / "results",
                              send_home=True)
    assert again.fetch_checkpoint() == 2
    round_, state = checkpoint.load(again.checkpoint_dir)
    assert round_ == 2 and state["w"].tolist() == [1.0, 1.0, 1.0]
    assert (resumed / "results" / "metrics.csv").read_text() == "1,site-1,0.5\n2,site-1,0.25\n"

    # refused by the parent (here: a damaged state file): the workflow fails, naming the round
    (channel.checkpoint_dir / "round-2.safetensors").write_bytes(b"damaged")
    with pytest.raises(CheckpointHomeError, match="checkpoint of round 2 could not be sent"):
        channel.checkpoint_committed(2)
    third = GrpcServerChannel(stub, session, JOB, ["site-1"], tmp_path / "third" / "results",
                              send_home=True)
    assert third.fetch_checkpoint() == 2  # the parent still holds the good one

    # a process worker's channel (its run folder is the parent's) sends nothing home
    local = GrpcServerChannel(stub, session, JOB, ["site-1"], pod / "results")
    parent.job_folder = tmp_path / "nowhere"
    local.checkpoint_committed(2)
