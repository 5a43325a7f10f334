"""A worker that outlives its parent (worker/rejoin.py), against real parent endpoints in this
process (parent/worker_endpoint.py): its parent goes, a new one listens on the same address and
expects the job's token; the worker's next calls register again with it and go on (a report, a
task streamed to it, a reply streamed from it). A new parent that does not expect that token, or
expects another job's, never takes it: the worker gives up with ParentGone after rejoin_s, and
a worker without rejoin_s fails at its first call as before. A parent that moved is dialled
where the run folder's file says (wire/parent_address.py)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.parent_address import FILE_NAME, read_parent, tell_parent
from atoll.wire.worker_link import SESSION_KEY, worker_channel
from atoll.worker.rejoin import ParentGone, RejoiningStub

JOB, OTHER = "job-1", "job-2"


class _Parent:
    """A parent's backend: what its worker told it, and one task for it."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, dict]] = []
        self.replies: list[bytes] = []

    def on_register(self, job_id):
        return {}

    def report(self, job_id, body):
        self.reports.append((job_id, body))

    def next_task(self, job_id, wait_s, as_files=False) -> Iterator[bytes]:
        yield from frames.payload_frames({"task_id": "t1", "topic": "train"}, [b"weights"])

    def send_reply(self, job_id, head, chunks):
        self.replies.append(b"".join(bytes(c) for c in chunks))
        return {}


def _parent(port: int = 0, expect: tuple[str, str] | None = None):
    tokens, backend = WorkerTokens(), _Parent()
    if expect is not None:
        tokens.expect(*expect)
    endpoint = start_worker_endpoint(tokens, backend, "127.0.0.1", port, unix_socket=False)
    return endpoint, tokens, backend


def _registered(address: str, token: str, rejoin_s: float, redial=None):
    stub = rpc.stub(worker_channel(address, None), "WorkerLink")
    answer = stub.Register(msg.Json(body=json.dumps({"job_id": JOB, "token": token})),
                           timeout=10)
    session = json.loads(answer.body)["session"]
    said: list[str] = []
    return RejoiningStub(stub, JOB, token, session, rejoin_s, say=said.append,
                         redial=redial), session, said


def _report(stub, session: str, kind: str = "progress") -> None:
    stub.Report(msg.Json(body=json.dumps({"kind": kind})), metadata=((SESSION_KEY, session),),
                timeout=10)


def test_a_worker_rejoins_the_parent_that_took_it_back_and_goes_on():
    first, tokens, _ = _parent()
    token = tokens.issue(JOB)
    port = int(first.address.rsplit(":", 1)[1])
    stub, session, said = _registered(first.address, token, rejoin_s=30)
    _report(stub, session)
    first.stop(0)  # the parent was killed; the next one listens where it did
    second, _, backend = _parent(port, expect=(JOB, token))
    try:
        _report(stub, session)  # the caller's old session: replaced by the one it got now
        head, chunks = frames.split(iter(stub.NextTask(msg.PullRequest(job_id=JOB, wait_s=1),
                                                       metadata=((SESSION_KEY, session),))))
        assert head["task_id"] == "t1" and b"".join(bytes(c) for c in chunks) == b"weights"
        stub.SendReply(frames.payload_frames({"task_id": "t1"}, [b"trained"]),
                       metadata=((SESSION_KEY, session),))
        assert stub.rejoins == 1 and any("rejoined" in line for line in said)
        assert [b["kind"] for _, b in backend.reports if b["kind"] != "heartbeat"] == [
            "progress"]
        assert backend.replies == [b"trained"]
    finally:
        second.stop(0)


@pytest.mark.parametrize("expected", [None, (OTHER, "token of another job"), (JOB, "a guess")])
def test_a_parent_that_does_not_expect_this_worker_never_takes_it(expected):
    first, tokens, _ = _parent()
    token = tokens.issue(JOB)
    port = int(first.address.rsplit(":", 1)[1])
    stub, session, _ = _registered(first.address, token, rejoin_s=2)
    first.stop(0)
    second, _, backend = _parent(port, expect=expected)
    try:
        with pytest.raises(ParentGone, match="did not take this worker back"):
            _report(stub, session)
        assert backend.reports == [] and stub.rejoins == 0
    finally:
        second.stop(0)


def test_a_parent_that_stays_away_ends_the_wait_after_rejoin_s():
    first, tokens, _ = _parent()
    stub, session, _ = _registered(first.address, tokens.issue(JOB), rejoin_s=2)
    first.stop(0)
    with pytest.raises(ParentGone, match=r"within 2 s \(supervision.rejoin_s\)"):
        _report(stub, session)
    with pytest.raises(grpc.RpcError):  # given up: its last calls (Finish) fail at once
        _report(stub, session)


def test_without_rejoin_s_the_first_failed_call_fails_as_before():
    first, tokens, _ = _parent()
    stub, session, _ = _registered(first.address, tokens.issue(JOB), rejoin_s=0)
    first.stop(0)
    with pytest.raises(grpc.RpcError) as failed:
        _report(stub, session)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_parent_that_moved_is_dialled_where_the_run_folder_says(tmp_path: Path):
    first, tokens, _ = _parent()
    token = tokens.issue(JOB)
    second, _, backend = _parent(expect=(JOB, token))  # elsewhere: another port

    def redial():
        found = read_parent(tmp_path)
        return None if found is None else rpc.stub(worker_channel(*found), "WorkerLink")

    stub, session, said = _registered(first.address, token, rejoin_s=30, redial=redial)
    first.stop(0)
    tell_parent(tmp_path, second.address, None)
    try:
        _report(stub, session)
        assert backend.reports[-1] == (JOB, {"kind": "progress"}) and stub.rejoins == 1
        assert any("another address" in line for line in said)
    finally:
        second.stop(0)


def test_the_parent_address_file_replaces_a_planted_link_and_is_read_bounded(tmp_path: Path):
    target = tmp_path / "parent-file-outside"
    target.write_text("untouched")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(target, run / FILE_NAME)  # the job's code planted it
    tell_parent(run, "127.0.0.1:7101", "PEM")
    assert target.read_text() == "untouched"
    assert not (run / FILE_NAME).is_symlink()
    assert stat.S_IMODE((run / FILE_NAME).stat().st_mode) == 0o644
    assert read_parent(run) == ("127.0.0.1:7101", "PEM")
    (run / FILE_NAME).write_text('{"address": 7}')
    assert read_parent(run) is None
    assert read_parent(tmp_path / "none") is None
