"""The server's revocation checks (server/revocation.py) without a federation: a certificate on
the list in force is refused on every call, only a project admin pushes a list, and a push closes
the control links of revoked sites and sends the list to the others. The live federation's side
is tests/integration/federation/test_revocation.py."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.crl import Entry, build_crl
from atoll.pki.identity import Identity
from atoll.pki.revocation import cert_serial
from atoll.server.revocation import ServerRevocations
from atoll.server.studies import Denied

CA = create_ca("proj")
ADMIN = Identity("admin@x.org", "x", "admin", "project_admin")
LEAD = Identity("lead@a.org", "org-a", "admin", "lead")
LEAD_PEM = issue_cert(CA, "lead@a.org", "org-a", "admin", "lead").cert_pem()
OTHER_PEM = issue_cert(CA, "other@a.org", "org-a", "admin", "lead").cert_pem()
SITE_A = issue_cert(CA, "site-a", "org-a", "site", None).cert_pem()
SITE_B = issue_cert(CA, "site-b", "org-b", "site", None).cert_pem()


def _crl(*pems: bytes, number: int = 1) -> str:
    now = dt.datetime.now(dt.UTC)
    return build_crl(CA, [Entry(cert_serial(p), now, "key-compromise") for p in pems],
                     number).decode()


class Link:
    def __init__(self, name: str):
        self.name, self.closed, self.sent = name, threading.Event(), []

    def close(self) -> None:
        self.closed.set()

    def send(self, kind: str, body: dict) -> None:
        self.sent.append((kind, body["number"]))


class Context:
    def __init__(self, pem: bytes):
        self.pem = pem

    def auth_context(self):
        return {"x509_pem_cert": [self.pem]}


@pytest.fixture
def gate(tmp_path):
    ca_file = tmp_path / "rootCA.pem"
    ca_file.write_bytes(CA.cert_pem())
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return ServerRevocations(workspace, ca_file, links=None)


def test_a_revoked_certificate_is_refused_and_the_others_are_not(gate):
    assert gate.refusal(LEAD_PEM) is None
    gate.push(ADMIN, "default", {"crl": _crl(LEAD_PEM)})
    assert "this certificate is revoked" in (gate.refusal(LEAD_PEM) or "")
    assert gate.refusal(OTHER_PEM) is None
    assert gate.refusal(b"not a certificate") == \
        "the server cannot read this certificate's serial number"


def test_only_a_project_admin_pushes_the_list(gate):
    with pytest.raises(Denied, match="only project admins may push the revocation list"):
        gate.push(LEAD, "default", {"crl": _crl(OTHER_PEM)})
    assert gate.refusal(OTHER_PEM) is None and gate.current.number == 0


def test_a_push_closes_revoked_sites_links_and_sends_the_list_to_the_others(gate):
    a, b = Link("site-a"), Link("site-b")
    gate.on_connect(a, Context(SITE_A))
    gate.on_connect(b, Context(SITE_B))
    out = gate.push(ADMIN, "default", {"crl": _crl(SITE_A)})
    assert out["sites_dropped"] == ["site-a"]
    assert a.closed.is_set() and a.sent == []
    assert not b.closed.is_set() and b.sent == [("revocations", 1)]


def test_a_site_revoked_before_it_connects_is_closed_at_once(gate):
    gate.push(ADMIN, "default", {"crl": _crl(SITE_A)})
    a, b = Link("site-a"), Link("site-b")
    gate.on_connect(a, Context(SITE_A))
    gate.on_connect(b, Context(SITE_B))
    assert a.closed.is_set() and a.sent == []
    assert not b.closed.is_set() and b.sent == [("revocations", 1)]


def test_the_auth_gate_refuses_a_revoked_caller_on_every_call(gate, tmp_path, monkeypatch):
    import grpc

    from atoll.server import revocation
    from atoll.server.auth import Gate, PeerRefused, check_peer
    from atoll.server.sqlite_store import SqliteStore

    class Caller:
        def __init__(self, pem: bytes, name: str):
            self._auth = {"x509_pem_cert": [pem],
                          "x509_subject": [f"OU=admin,O=org-a,CN={name},title=lead".encode()]}

        def auth_context(self):
            return self._auth

    monkeypatch.setattr(revocation, "_active", None)
    gate.activate()
    gate.push(ADMIN, "default", {"crl": _crl(LEAD_PEM)})
    store = SqliteStore(tmp_path / "atoll.db")
    try:
        with pytest.raises(PeerRefused) as refused:
            Gate("Admin", "admin", store).enter(Caller(LEAD_PEM, LEAD.name), "Call")
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "this certificate is revoked" in refused.value.details
        with pytest.raises(PeerRefused, match="this certificate is revoked"):
            check_peer(Caller(LEAD_PEM, LEAD.name), "admin")
        assert check_peer(Caller(OTHER_PEM, "other@a.org"), "admin").name == "other@a.org"
    finally:
        store.close()


class CountingEvent(threading.Event):
    """A link's `closed`, counting how often the gate looks at it."""

    looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        return super().is_set()


def test_a_connecting_site_does_not_make_the_gate_look_at_every_other_link(gate):
    # 10,000 sites connecting: a walk over every watched link per connection was 50 million
    # looks on the server's event loop. Each connection is watched in constant work.
    first = Link("site-0")
    first.closed = CountingEvent()
    gate.on_connect(first, Context(SITE_A))
    for n in range(1, 300):
        gate.on_connect(Link(f"site-{n}"), Context(SITE_B))
    assert first.closed.looks <= 2


def test_a_reconnected_site_is_watched_on_its_newest_link_only(gate):
    links = []
    for _ in range(50):  # the site reconnects: each new link replaces (and closes) the last
        if links:
            links[-1].close()
        links.append(Link("site-a"))
        gate.on_connect(links[-1], Context(SITE_A))
    b = Link("site-b")
    gate.on_connect(b, Context(SITE_B))
    assert len(gate._serials) == 2  # one per site, however often it reconnected
    out = gate.push(ADMIN, "default", {"crl": _crl(SITE_A)})
    assert out["sites_dropped"] == ["site-a"]
    assert links[-1].closed.is_set() and b.sent == [("revocations", 1)]


def test_a_link_closed_before_it_is_watched_does_not_hide_the_sites_live_one(gate):
    live, old = Link("site-a"), Link("site-a")
    gate.on_connect(live, Context(SITE_A))
    old.close()  # an older link's late start: already replaced
    gate.on_connect(old, Context(SITE_A))
    gate.push(ADMIN, "default", {"crl": _crl(SITE_A)})
    assert live.closed.is_set()
