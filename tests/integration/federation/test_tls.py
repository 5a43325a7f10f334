"""Mutual TLS at the server's door: who may connect, and as whom."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import grpc
import pytest

from atoll import __version__
from atoll.admin.session import Session
from atoll.pki.ca import create_ca, load_ca
from atoll.pki.certs import issue_cert
from atoll.pki.kit import load_kit
from atoll.pki.tls import channel_credentials
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from tests.integration.federation.conftest import ADMIN


def _site_kit_with(federation, tmp_path, name, issued):
    """A copy of a site kit whose certificate and key are replaced by `issued`."""
    kit = tmp_path / name
    shutil.copytree(federation.kit(name), kit, ignore=shutil.ignore_patterns("workspace"))
    issued.write(kit / "startup" / "client.crt", kit / "startup" / "client.key")
    return load_kit(kit)


def _hello(kit) -> grpc.RpcError | list:
    channel = grpc.secure_channel(kit.server_address, channel_credentials(kit))
    stub = rpc.stub(channel, "Federation")

    def events():
        yield msg.SiteEvent(hello=json.dumps({"capacity": {}, "running_jobs": []}))

    try:
        return list(stub.Connect(events(), timeout=5))
    except grpc.RpcError as exc:
        return exc
    finally:
        channel.close()


def test_certificate_from_another_ca_is_refused(federation, tmp_path):
    other = create_ca("impostor")
    kit = _site_kit_with(federation, tmp_path, "site-1",
                         issue_cert(other, "site-1", "org-site-1", "site"))
    outcome = _hello(kit)
    assert isinstance(outcome, grpc.RpcError)
    assert outcome.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails


def test_expired_certificate_is_refused(federation, tmp_path):
    ca = load_ca(federation.root / "ca")
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = issue_cert(ca, "site-1", "org-site-1", "site", not_before=past,
                         not_after=past + dt.timedelta(days=1))
    outcome = _hello(_site_kit_with(federation, tmp_path, "site-1", expired))
    assert isinstance(outcome, grpc.RpcError)
    assert outcome.code() == grpc.StatusCode.UNAVAILABLE


def test_client_without_certificate_is_refused(federation):
    kit = load_kit(federation.kit(ADMIN))
    creds = grpc.ssl_channel_credentials(root_certificates=kit.ca.read_bytes())
    channel = grpc.secure_channel(kit.server_address, creds)
    with pytest.raises(grpc.RpcError) as err:
        rpc.stub(channel, "Admin").Call(msg.Json(body='{"op": "whoami"}'), timeout=5)
    channel.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_site_is_who_its_certificate_says(federation, tmp_path):
    """site-2's kit holding site-1's certificate is seen as site-1, whatever its hello says."""
    import threading

    ca = load_ca(federation.root / "ca")
    kit = _site_kit_with(federation, tmp_path, "site-2",
                         issue_cert(ca, "site-1", "org-site-1", "site"))
    channel = grpc.secure_channel(kit.server_address, channel_credentials(kit))
    stop = threading.Event()

    def events():
        yield msg.SiteEvent(hello=json.dumps({"name": "site-2", "launcher": "impostor",
                                             "version": __version__, "capacity": {},
                                             "running_jobs": []}))
        stop.wait(10)

    stream = rpc.stub(channel, "Federation").Connect(events(), timeout=15)
    assert next(stream).WhichOneof("kind") == "welcome"
    with Session(federation.kit(ADMIN)) as admin:
        seen = {s["name"]: s["launcher"] for s in admin.sites()["sites"]}
    stop.set()
    channel.close()
    assert seen["site-1"] == "impostor"  # the certificate's name, not the claimed one
    assert seen["site-2"] == "process"
    # A site certificate cannot call admin operations either.
    channel = grpc.secure_channel(kit.server_address, channel_credentials(kit))
    with pytest.raises(grpc.RpcError) as err:
        rpc.stub(channel, "Admin").Call(msg.Json(body='{"op": "whoami"}'), timeout=5)
    channel.close()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "site certificate" in err.value.details()
    federation.wait_online(ADMIN)  # the real site-1 reconnects by itself


def test_admin_certificate_cannot_act_as_a_site(federation):
    kit = load_kit(federation.kit(ADMIN))
    channel = grpc.secure_channel(kit.server_address, channel_credentials(kit))
    stub = rpc.stub(channel, "Federation")
    calls = {  # every site call; most run on the server's event loop, where abort is awaited
        "Connect": lambda: list(stub.Connect(iter([msg.SiteEvent(hello="{}")]), timeout=5)),
        "FetchJob": lambda: list(stub.FetchJob(msg.JobRef(job_id="x"), timeout=5)),
        "PullTask": lambda: list(stub.PullTask(msg.PullRequest(job_id="x"), timeout=5)),
        "PushReply": lambda: stub.PushReply(iter([frames.header({"job_id": "x"})]), timeout=5),
        "Report": lambda: stub.Report(msg.Json(body='{"job_id": "x"}'), timeout=5),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
        assert "admin certificate" in err.value.details(), name
    channel.close()
