"""A parent's worker endpoint off loopback speaks TLS with a certificate it made at start.

The evidence that a link used TLS is what gRPC's transport saw at the endpoint (its auth
context, logged at each registration: parent/worker_endpoint.py ``link_security``), never the
configuration: an endpoint that silently served plaintext would log "plaintext TCP"."""

from __future__ import annotations

import json
import logging
import re

import grpc
import pytest
import yaml

from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from atoll.wire import messages as msg
from atoll.wire import rpc
from atoll.wire.worker_link import worker_channel
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, wait_for
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


def _register(address: str, cert_pem: str | None, tokens: WorkerTokens) -> None:
    body = msg.Json(body=json.dumps({"job_id": "j1", "token": tokens.issue("j1")}))
    channel = worker_channel(address, cert_pem)
    try:
        rpc.stub(channel, "WorkerLink").Register(body, timeout=5)
    finally:
        channel.close()


@pytest.mark.parametrize("tls", [True, False])
def test_each_registration_logs_the_transport_the_worker_really_used(tls, caplog):
    tokens = WorkerTokens()
    endpoint = start_worker_endpoint(tokens, _NoBackend(), "127.0.0.1", 0, tls=tls)
    caplog.set_level(logging.INFO, logger="atoll.parent.worker_endpoint")
    try:
        _register(endpoint.address, endpoint.cert_pem, tokens)
        _register(f"unix:{endpoint.socket_path}", endpoint.cert_pem, tokens)
    finally:
        endpoint.stop(0)
    tcp = "TLS (TLSv1." if tls else "plaintext TCP"
    lines = [r.getMessage() for r in caplog.records if "registered over" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith(f"job j1: its worker registered over {tcp}"), lines
    assert lines[1] == "job j1: its worker registered over the unix socket (no TLS)"


# what parent/worker_endpoint.py link_security says (the log quotes the message after it)
KNOWN = r"(TLS \(TLSv[0-9.]+\)|the unix socket \(no TLS\)|plaintext TCP)"


def _worker_address(log: str, name: str) -> str:
    found = re.search(r"workers dial ([^\s']+)", log)  # the log quotes the message
    assert found, f"{name} never said where its workers dial:\n{log}"
    return found.group(1)


def _refuses_plaintext(address: str) -> bool:
    """A plaintext Register to a TLS port fails in the handshake (UNAVAILABLE), before any
    token is looked at; a plaintext port would answer PERMISSION_DENIED (bad token)."""
    channel = grpc.insecure_channel(address)
    body = msg.Json(body=json.dumps({"job_id": "0" * 32, "token": "not-a-token"}))
    try:
        rpc.stub(channel, "WorkerLink").Register(body, timeout=10)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
    return False


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
        for name in ("server", "site-1"):
            address = _worker_address(fed.log(name), name)
            assert re.fullmatch(r"127\.0\.0\.1:[0-9]+", address), address  # dialable as read
            assert _refuses_plaintext(address), f"{name}'s worker endpoint {address} spoke " \
                "plaintext"
        with fed.session(ADMIN) as session:
            job = session.submit(make_job(tmp_path / "job", rounds=2), wait=True, timeout=120)
        registered = f"job {job['job_id']}: its worker registered over "
        # logged before the worker's first task: there once the job finished; waited for all
        # the same, the three parents' logs being written by other processes
        wait_for(lambda: all(registered in fed.log(n) for n in ("server", "site-1", "site-2")),
                 timeout=60, what="every parent's registration line")
    finally:
        fed.stop_all()
    assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"])

    known = re.compile(re.escape(registered) + KNOWN)

    def transports(name: str) -> list[str]:
        """The transport of each registration line in the parent's log (a line of another
        form, whole)."""
        lines = [line for line in fed.log(name).splitlines() if registered in line]
        return [m.group(1) if (m := known.search(line)) else line for line in lines]

    # the two parents with a TLS endpoint: their workers' links were TLS, as gRPC saw them
    for name in ("server", "site-1"):
        seen = transports(name)
        assert seen and all(t.startswith("TLS (TLSv1.") for t in seen), (name, seen)
    # site-2 keeps the default (its workers in a network of their own): the same line names the
    # socket it used, so the lines above tell the transports apart
    assert set(transports("site-2")) == {"the unix socket (no TLS)"}, transports("site-2")
