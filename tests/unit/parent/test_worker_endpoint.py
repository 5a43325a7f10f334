"""One-time job tokens at a real worker endpoint: spent once, bound to their job."""

from __future__ import annotations

import json

import grpc
import pytest

from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.wire import messages as msg
from atoll.wire import rpc


class _NoBackend:
    def on_register(self, job_id):
        return {}


def _register(stub, job_id, token):
    body = msg.Json(body=json.dumps({"job_id": job_id, "token": token}))
    return stub.Register(body, timeout=5)


def test_a_token_is_spent_once_and_only_for_its_job():
    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, _NoBackend(), "127.0.0.1", 0)
    channel = grpc.insecure_channel(endpoint.address)
    try:
        stub = rpc.stub(channel, "WorkerLink")
        token, other = tokens.issue("job-1"), tokens.issue("job-2")
        with pytest.raises(grpc.RpcError) as foreign:
            _register(stub, "job-1", other)  # job-2's token for job-1
        assert json.loads(_register(stub, "job-1", token).body)["session"]
        with pytest.raises(grpc.RpcError) as reused:
            _register(stub, "job-1", token)
        tokens.revoke("job-2")
        with pytest.raises(grpc.RpcError) as revoked:
            _register(stub, "job-2", other)
        for err in (foreign, reused, revoked):
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "job token refused" in err.value.details()
    finally:
        channel.close()
        endpoint.stop(0)


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "[" * 100000, "{\"x\": \"" + "a" * 70000 + "\"}"])
def test_a_bad_body_is_invalid_argument_not_a_traceback(body):
    """The worker runs the job's code: whatever it sends gets a clear answer."""
    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, _NoBackend(), "127.0.0.1", 0)
    channel = grpc.insecure_channel(endpoint.address)
    try:
        with pytest.raises(grpc.RpcError) as err:
            rpc.stub(channel, "WorkerLink").Register(msg.Json(body=body), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
        endpoint.stop(0)


def test_the_unix_socket_checks_the_same_token_and_its_folder_is_the_parents_alone():
    """Workers with a network namespace of their own dial the socket bound into their sandbox;
    a TLS endpoint's socket needs no certificate (worker_channel) and still spends the token."""
    import os
    import stat

    from atoll.wire.worker_link import worker_channel

    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, _NoBackend(), "127.0.0.1", 0, tls=True)
    folder = os.path.dirname(endpoint.socket_path)
    channel = worker_channel(f"unix:{endpoint.socket_path}", endpoint.cert_pem)
    try:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(endpoint.socket_path).st_mode)
        stub = rpc.stub(channel, "WorkerLink")
        token = tokens.issue("job-1")
        with pytest.raises(grpc.RpcError) as wrong:
            _register(stub, "job-1", "not-the-token")
        assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert json.loads(_register(stub, "job-1", token).body)["session"]
    finally:
        channel.close()
        endpoint.stop(0)
    assert not os.path.exists(folder)


@pytest.mark.parametrize("job_id", ["../x", "a/b", "x\n", "", None, 7])
def test_a_crafted_job_id_is_invalid_argument_naming_it(job_id):
    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, _NoBackend(), "127.0.0.1", 0)
    channel = grpc.insecure_channel(endpoint.address)
    try:
        with pytest.raises(grpc.RpcError) as err:
            _register(rpc.stub(channel, "WorkerLink"), job_id, "t")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid job id" in err.value.details()
    finally:
        channel.close()
        endpoint.stop(0)


class _Replies(_NoBackend):
    """A backend that records which task's replies it was asked for (none are waiting)."""

    def __init__(self):
        self.asked = []

    def next_reply(self, job_id, task_id, wait_s, *rest):
        self.asked.append((job_id, task_id))
        return iter(())


@pytest.mark.parametrize("task_id", ["../x", "a/b", "a b", "t" * 65])  # gRPC carries no newline
def test_a_crafted_task_id_in_a_reply_pull_is_invalid_argument_before_the_backend(task_id):
    from atoll.wire.worker_link import SESSION_KEY

    tokens, backend = WorkerTokens(), _Replies()
    endpoint = start_worker_endpoint(tokens, backend, "127.0.0.1", 0)
    channel = grpc.insecure_channel(endpoint.address)
    try:
        stub = rpc.stub(channel, "WorkerLink")
        session = json.loads(_register(stub, "job-1", tokens.issue("job-1")).body)["session"]

        def pull(task):
            metadata = ((SESSION_KEY, session), ("x-atoll-task", task))
            return list(stub.NextReply(msg.PullRequest(job_id="job-1", wait_s=0.0),
                                       metadata=metadata, timeout=5))

        with pytest.raises(grpc.RpcError) as err:
            pull(task_id)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "x-atoll-task header" in err.value.details()
        assert backend.asked == []
        assert pull("t1") == [] and backend.asked == [("job-1", "t1")]  # the control
    finally:
        channel.close()
        endpoint.stop(0)


def test_an_expected_token_is_taken_once_and_for_its_job_only():
    tokens = WorkerTokens()
    tokens.expect("job-1", "kept-token")  # a worker an earlier parent launched, taken back
    assert tokens.exchange("job-2", "kept-token") is None
    assert tokens.exchange("job-1", "another") is None
    session = tokens.exchange("job-1", "kept-token")
    assert session is not None and tokens.job_of(session) == "job-1"
    assert tokens.exchange("job-1", "kept-token") is None  # spent again
