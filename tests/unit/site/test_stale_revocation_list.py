"""A site runs no job while the revocation list it holds is past its nextUpdate: the CA meant
to have replaced it, and a server that withholds the newer list must not keep a revoked user's
jobs running (site/revocation.py). atoll's own lists carry the CA's end, so they never lapse
before the CA does. Real CAs, real CRLs, verified in a process of their own as a site does."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from atoll.pki.ca import create_ca
from atoll.pki.crl import build_crl
from atoll.site import revocation
from atoll.site.revocation import SiteRevocations


def lapsed_crl(ca, number: int) -> str:
    """A list the CA signed two days ago, due to be replaced yesterday."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateRevocationListBuilder().issuer_name(ca.cert.subject)
            .last_update(now - dt.timedelta(days=2)).next_update(now - dt.timedelta(days=1))
            .add_extension(x509.CRLNumber(number), critical=False)
            .sign(ca.key, hashes.SHA256()).public_bytes(Encoding.PEM).decode())


def site_holding(tmp_path, monkeypatch, ca, crl: str | None = None) -> SiteRevocations:
    monkeypatch.setattr(revocation, "_active", None)  # restored after the test
    ca_file = tmp_path / "rootCA.pem"
    ca_file.write_bytes(ca.cert.public_bytes(Encoding.PEM))
    (tmp_path / "ws").mkdir()
    held = SiteRevocations(tmp_path / "ws", ca_file)
    held.activate()
    assert held.on_command({"crl": crl or build_crl(ca, [], 3).decode()}) is True
    return held


def test_a_list_past_its_next_update_stops_every_job(tmp_path, monkeypatch):
    ca = create_ca("p")
    site_holding(tmp_path, monkeypatch, ca, lapsed_crl(ca, 3))
    why = revocation.stale()
    assert why is not None and why.startswith("the revocation list 3 this site holds was due "
                                              "to be replaced by ")
    assert "`atoll crl push`" in why

    from atoll.pki.certs import issue_cert
    from atoll.pki.identity import Identity
    from atoll.pki.job_signature import Signed, Statement
    from atoll.site.job_acceptance import JobRefused, check_revoked

    signer = Identity("lead@a.org", "a", "admin", "lead")
    signed = Signed(signer, Statement("p", "s", signer.name, 0, {}),
                    issue_cert(ca, signer.name, "a", "admin", "lead").cert_pem())
    with pytest.raises(JobRefused, match="site-a refused the job: the revocation list 3 this "
                                         "site holds was due to be replaced"):
        check_revoked("site-a", signed)


def test_atolls_own_lists_do_not_lapse_before_their_ca(tmp_path, monkeypatch):
    ca = create_ca("p")
    held = site_holding(tmp_path, monkeypatch, ca)
    assert revocation.stale() is None
    due = dt.datetime.fromisoformat(held.store.current.next_update)
    assert due == ca.cert.not_valid_after_utc
    assert revocation.stale(now=due.timestamp() + 1) is not None


@pytest.mark.parametrize("active", [False, True])
def test_no_list_at_all_is_not_a_stale_one(tmp_path, monkeypatch, active):
    monkeypatch.setattr(revocation, "_active", None)
    if active:
        (tmp_path / "ws").mkdir()
        ca_file = tmp_path / "rootCA.pem"
        ca_file.write_bytes(create_ca("p").cert.public_bytes(Encoding.PEM))
        SiteRevocations(tmp_path / "ws", ca_file).activate()
    assert revocation.stale() is None
