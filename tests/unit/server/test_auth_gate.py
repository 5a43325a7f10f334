"""The server's admission of calls (server/auth.py): the certificate's kind, per-peer limits,
audited refusals, in a real job store (SQLite file). No timing: limits are set so that the
tokens a bucket regains while the test runs are far below one call."""

from __future__ import annotations

import hashlib
import ssl

import grpc
import pytest

from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.server.auth import AuditThrottle, Gate, PeerLimit, PeerRefused, fingerprint
from atoll.server.sessions import SessionSigner
from atoll.server.sqlite_store import SqliteStore

CA = create_ca("unit")


class Context:
    """What the gate reads of a call: the verified peer's certificate and subject."""

    def __init__(self, name: str, kind: str, org: str = "org", role: str | None = None):
        self.pem = issue_cert(CA, name, org, kind, role).cert_pem()
        subject = f"OU={kind},O={org},CN={name}" + (f",title={role}" if role else "")
        self._auth = {"x509_pem_cert": [self.pem], "x509_subject": [subject.encode()]}

    def auth_context(self):
        return self._auth


def _limits(calls=2, rate=1e-6, burst=1000):
    limit = PeerLimit(calls=calls, rate=rate, burst=burst)
    return {"site": limit, "admin": limit}


@pytest.fixture
def store(tmp_path):
    store = SqliteStore(tmp_path / "atoll.db")
    yield store
    store.close()


def test_a_certificate_of_another_kind_is_refused_and_audited(store):
    gate = Gate("Admin", "admin", store, _limits())
    site = Context("site-1", "site")
    with pytest.raises(PeerRefused) as err:
        gate.enter(site, "Submit")
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "site-1 holds a site certificate; Admin.Submit needs an admin" in err.value.details
    (entry,) = store.audit_log()
    assert (entry["user"], entry["action"], entry["outcome"]) == ("site-1", "Admin.Submit",
                                                                   "refused")
    der = ssl.PEM_cert_to_DER_cert(site.pem.decode())
    assert f"sha256:{hashlib.sha256(der).hexdigest()}" in entry["detail"]
    assert fingerprint(site.pem) == hashlib.sha256(der).hexdigest()


def test_calls_open_at_once_are_limited_per_certificate(store):
    gate = Gate("Federation", "site", store, _limits(calls=2))
    one, other = Context("site-1", "site"), Context("site-2", "site")
    _, release_a = gate.enter(one, "PullTask")
    _, release_b = gate.enter(one, "PushReply")
    with pytest.raises(PeerRefused) as err:
        gate.enter(one, "Connect")
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "site-1 already has 2 calls open" in err.value.details
    gate.enter(other, "Connect")  # another certificate is not held back
    release_a()
    release_a()  # a second release changes nothing
    assert gate.open_calls("site", "site-1") == 1
    gate.enter(one, "Connect")
    with pytest.raises(PeerRefused):
        gate.enter(one, "Connect")
    release_b()
    assert not store.audit_log()  # limits are not audit entries (they are logged)


def test_calls_per_second_are_limited_per_certificate(store):
    gate = Gate("Admin", "admin", store, _limits(calls=100, burst=3))
    lead, other = Context("lead@a", "admin", role="lead"), Context("lead@b", "admin", role="lead")
    for _ in range(3):
        gate.enter(lead, "Call")[1]()
    with pytest.raises(PeerRefused) as err:
        gate.enter(lead, "Call")
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than 1e-06 calls a second" in err.value.details
    gate.enter(other, "Call")


def test_refusals_of_one_kind_are_written_once_then_counted():
    now = [0.0]
    throttle = AuditThrottle(every_s=10.0, clock=lambda: now[0])
    assert throttle.note(("cert", "Admin.Call")) == ""
    assert throttle.note(("cert", "Admin.Call")) is None
    assert throttle.note(("cert", "Admin.Call")) is None
    assert throttle.note(("cert", "Admin.Submit")) == ""  # another kind
    now[0] = 10.0
    assert throttle.note(("cert", "Admin.Call")) == " (and 2 more like it since the last entry)"


def test_session_tokens_are_checked_for_their_user(tmp_path):
    signer = SessionSigner(tmp_path / "session.key")
    token = signer.issue("lead@a", "alpha")
    grant = signer.check(token, "lead@a")
    assert grant is not None and (grant.study, grant.expired) == ("alpha", False)
    assert signer.check(token, "lead@b") is None  # another user's
    assert signer.check(token[:-2] + "xx", "lead@a") is None  # altered
    for junk in ("", "v1", "v1.a.b.c", "v1.é.é"):
        assert signer.check(junk, "lead@a") is None
    expired = signer.check(signer.issue("lead@a", "alpha", ttl_s=-10), "lead@a")
    assert expired is not None and expired.expired
    assert signer.verify(signer.issue("lead@a", "alpha", ttl_s=-10), "lead@a") is None


class CountingContext(Context):
    reads = 0

    def auth_context(self):
        self.reads += 1
        return super().auth_context()


def test_a_handler_takes_its_caller_from_the_gate_that_admitted_its_call(store):
    # The certificate is read and checked once per call, at admission, not again by the
    # handler: at 10,000 sites every call's second check was server CPU spent twice.
    import asyncio

    from atoll.server.auth import peer_identity_async

    gate = Gate("Federation", "site", store, _limits(calls=10))
    call, other_call = CountingContext("site-1", "site"), CountingContext("site-2", "site")

    async def one_call():
        release = await gate.admit(call, "PullTask")
        try:
            who = await peer_identity_async(call, "site")
            # another call's context in this task is checked in full: never this caller
            other = await peer_identity_async(other_call, "site")
        finally:
            release()
        return who, other

    who, other = asyncio.run(one_call())
    assert (who.name, other.name) == ("site-1", "site-2")
    assert (call.reads, other_call.reads) == (1, 1)


def test_a_call_that_was_not_admitted_is_checked_in_full(store):
    import asyncio

    from atoll.server.auth import peer_identity_async

    gate = Gate("Federation", "site", store, _limits(calls=10))
    call = CountingContext("site-1", "site")

    async def admitted_elsewhere():  # a task of its own, as gRPC starts one per call
        await gate.admit(call, "PullTask")

    async def main():
        await asyncio.create_task(admitted_elsewhere())
        return await peer_identity_async(call, "site")

    assert asyncio.run(main()).name == "site-1"
    assert call.reads == 2  # the admission's task kept its caller to itself
