"""How the server learns of a participant provisioned since it started (`study add-user` before
the user's first login): only from a certificate its project's CA issued, valid now."""

from __future__ import annotations

import datetime as dt

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.identity import IdentityError, issued_identity


def test_a_certificate_of_the_projects_ca_names_its_holder():
    ca = create_ca("proj")
    user = issue_cert(ca, "new@org", "org", "admin", "lead")
    who = issued_identity(user.cert_pem(), ca.cert_pem())
    assert (who.name, who.org, who.kind, who.role) == ("new@org", "org", "admin", "lead")


def test_a_certificate_of_another_ca_is_refused():
    ours, theirs = create_ca("proj"), create_ca("proj")
    forged = issue_cert(theirs, "new@org", "org", "admin", "project_admin")
    with pytest.raises(IdentityError, match="not issued by this project's CA"):
        issued_identity(forged.cert_pem(), ours.cert_pem())


def test_an_expired_certificate_is_refused():
    ca = create_ca("proj")
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    old = issue_cert(ca, "new@org", "org", "admin", "lead", not_before=past,
                     not_after=past + dt.timedelta(days=1))
    with pytest.raises(IdentityError, match="not valid now"):
        issued_identity(old.cert_pem(), ca.cert_pem())


def test_garbage_is_refused():
    ca = create_ca("proj")
    with pytest.raises(IdentityError):
        issued_identity(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
                        ca.cert_pem())
