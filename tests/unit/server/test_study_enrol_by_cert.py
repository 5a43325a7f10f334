"""`study add-user` right after `provision add-user` (wrong turn 4 of issue 25): the server has
not seen the user yet; the certificate sent with the request, checked against the project's
CA, makes them known. A certificate of another CA, or another participant's, is refused."""

from __future__ import annotations

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.identity import Identity, issued_identity
from atoll.server.sqlite_store import SqliteStore
from atoll.server.studies import Denied, Studies
from atoll.server.study_ops import StudyOps

ADMIN = Identity("admin@x.org", "x", "admin", "project_admin")
ORG_ADMIN = Identity("boss@b.org", "org-b", "admin", "org_admin")
CA = create_ca("proj")


@pytest.fixture
def ops(tmp_path):
    store = SqliteStore(tmp_path / "atoll.db")
    store.upsert_participant("site-a", "site", "org-a")
    store.upsert_participant(ADMIN.name, "admin", "x", "project_admin")
    ops = StudyOps(Studies(store), store, lambda pem: issued_identity(pem, CA.cert_pem()))
    ops.create(ADMIN, "default", {"name": "trial", "sites": ["site-a"]})
    yield ops
    store.close()


def _pem(ca, name, org="org-a", kind="admin", role="lead") -> str:
    return issue_cert(ca, name, org, kind, role).cert_pem().decode()


def test_a_user_never_seen_is_added_with_their_certificate(ops):
    with pytest.raises(ValueError, match="is not a provisioned user"):
        ops.add_user(ADMIN, "trial", {"name": "trial", "user": "new@a.org"})
    added = ops.add_user(ADMIN, "trial", {"name": "trial", "user": "new@a.org",
                                          "cert": _pem(CA, "new@a.org")})
    assert added["users"] == ["new@a.org"]


def test_a_site_never_seen_is_enrolled_with_its_certificate(ops):
    added = ops.add_site(ADMIN, "trial", {"name": "trial", "site": "site-new",
                                          "cert": _pem(CA, "site-new", kind="site", role=None)})
    assert added["sites"] == ["site-a", "site-new"]


def test_a_certificate_of_another_ca_or_of_someone_else_is_refused(ops):
    with pytest.raises(ValueError, match="not issued by this project's CA"):
        ops.add_user(ADMIN, "trial", {"name": "trial", "user": "new@a.org",
                                      "cert": _pem(create_ca("proj"), "new@a.org")})
    with pytest.raises(ValueError, match="certificate of 'other@a.org', not of 'new@a.org'"):
        ops.add_user(ADMIN, "trial", {"name": "trial", "user": "new@a.org",
                                      "cert": _pem(CA, "other@a.org")})


def test_an_org_admin_cannot_register_another_orgs_user(ops):
    with pytest.raises(Denied, match="may not change the users of study trial"):
        ops.add_user(ORG_ADMIN, "trial", {"name": "trial", "user": "new@a.org",
                                          "cert": _pem(CA, "new@a.org", org="org-a")})
    assert ops.studies.users("trial") == []
    assert all(p["name"] != "new@a.org" for p in ops.store.participants())
