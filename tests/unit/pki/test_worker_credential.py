"""A site parent certifies its worker's secure aggregation key with the site's own key, in a
process of its own; the other sites' workers accept exactly that credential, for that site
and job, and nothing made with another key, certificate or CA."""

from __future__ import annotations

import json

import pytest

from atoll.fl.privacy.secagg.identity import CredentialError, SiteIdentity, check
from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.worker_credential import CredentialNotIssued, issue, issue_apart


@pytest.fixture(scope="module")
def project():
    ca = create_ca("proj")
    return ca, issue_cert(ca, "hospital-a", "Hospital A", "site")


def test_the_credential_made_apart_is_the_sites_for_this_job(tmp_path, project):
    ca, site = project
    for name, data in (("site.key", site.key_pem()), ("site.crt", site.cert_pem()),
                       ("ca.crt", ca.cert_pem())):
        (tmp_path / name).write_bytes(data)
    secret = issue_apart(tmp_path / "site.key", tmp_path / "site.crt", tmp_path / "ca.crt", "j1")
    identity = SiteIdentity.from_secret("hospital-a", "j1", secret)
    assert check(identity.credential, ca.cert_pem(), "j1", "hospital-a")
    with pytest.raises(CredentialError, match="another job"):
        check(identity.credential, ca.cert_pem(), "j2", "hospital-a")
    with pytest.raises(CredentialError, match="belongs to site 'hospital-a'"):
        check(identity.credential, ca.cert_pem(), "j1", "hospital-b")
    with pytest.raises(CredentialNotIssued, match="could not be certified"):
        issue_apart(tmp_path / "missing.key", tmp_path / "site.crt", tmp_path / "ca.crt", "j1")


def test_a_credential_of_another_ca_or_of_a_user_is_refused(project):
    ca, site = project
    other = create_ca("proj")
    forged = issue_cert(other, "hospital-a", "Hospital A", "site")
    doc = issue(forged.key_pem(), forged.cert_pem(), other.cert_pem(), "j1")
    with pytest.raises(CredentialError, match="not issued by this project's CA"):
        check(doc["credential"], ca.cert_pem(), "j1", "hospital-a")
    user = issue_cert(ca, "hospital-a", "Hospital A", "admin", "lead")
    doc = issue(user.key_pem(), user.cert_pem(), ca.cert_pem(), "j1")
    with pytest.raises(CredentialError, match="belongs to admin"):
        check(doc["credential"], ca.cert_pem(), "j1", "hospital-a")


def test_a_statement_changed_after_signing_is_refused(project):
    ca, site = project
    doc = issue(site.key_pem(), site.cert_pem(), ca.cert_pem(), "j1")
    statement = json.loads(doc["credential"]["statement"])
    statement["key"] = "A" * 43 + "="  # another key
    changed = {**doc["credential"], "statement": json.dumps(statement, sort_keys=True,
                                                            separators=(",", ":"))}
    with pytest.raises(CredentialError, match="not signed by hospital-a's key"):
        check(changed, ca.cert_pem(), "j1", "hospital-a")
