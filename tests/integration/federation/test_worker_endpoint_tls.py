"""A parent's worker endpoint off loopback speaks TLS with a certificate it made at start."""

from __future__ import annotations

import json

import grpc
import pytest
import yaml

from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.wire import messages as msg
from atoll.wire import rpc
from atoll.wire.worker_link import worker_channel
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job


class _NoBackend:
    def on_register(self, job_id):
        return {}


def test_tls_endpoint_refuses_plaintext_and_other_certificates():
    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, _NoBackend(), "127.0.0.1", 0, tls=True)
    other = start_worker_endpoint(WorkerTokens(), _NoBackend(), "127.0.0.1", 0, tls=True)
    try:
        token = tokens.issue("j1")
        body = msg.Json(body=json.dumps({"job_id": "j1", "token": token}))
        for channel in (grpc.insecure_channel(endpoint.address),
                        worker_channel(endpoint.address, other.cert_pem)):
            with pytest.raises(grpc.RpcError) as err:
                rpc.stub(channel, "WorkerLink").Register(body, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            channel.close()
        channel = worker_channel(endpoint.address, endpoint.cert_pem)
        answer = rpc.stub(channel, "WorkerLink").Register(body, timeout=5)
        assert json.loads(answer.body)["session"]
        channel.close()
    finally:
        endpoint.stop(0)
        other.stop(0)


def test_a_job_completes_through_tls_worker_endpoints(tmp_path):
    fed = Federation.provisioned(tmp_path / "tls", ["site-1", "site-2"], USERS)
    for name in ("server", "site-1"):
        path = fed.kit(name) / "local" / "site.yaml"
        config = yaml.safe_load(path.read_text()) or {}
        config["worker_endpoint"] = {"host": "127.0.0.1", "tls": "always"}
        # workers on the host's network dial the endpoint on TCP (with their own network they
        # would take the parent's unix socket, which speaks no TLS)
        config["process"] = {"network": "host"}
        path.write_text(yaml.safe_dump(config))
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as session:
            job = session.submit(make_job(tmp_path / "job", rounds=2), wait=True, timeout=120)
    finally:
        fed.stop_all()
    assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"])
