"""`default` is explicit: it holds everyone only while the project has no named study; past
that it is an ordinary study (kept, with no members, only if it has jobs)."""

from __future__ import annotations

import pytest

from atoll.pki.identity import Identity
from atoll.server.sqlite_store import SqliteStore
from atoll.server.studies import DEFAULT, Denied, Studies
from atoll.server.study_ops import StudyOps

ADMIN = Identity("admin@x.org", "x", "admin", "project_admin")
LEAD = Identity("lead@a.org", "org-a", "admin", "lead")
PROJECT = {"sites": [{"name": "site-a", "org": "org-a"}, {"name": "site-b", "org": "org-b"}],
           "users": [{"name": ADMIN.name, "org": "x", "role": "project_admin"},
                     {"name": LEAD.name, "org": "org-a", "role": "lead"}]}


@pytest.fixture
def store(tmp_path):
    store = SqliteStore(tmp_path / "atoll.db")
    yield store
    store.close()


def _no_certificate(pem: bytes) -> Identity:
    raise ValueError("these tests send no certificate")


def _ops(store) -> StudyOps:
    return StudyOps(Studies(store), store, _no_certificate)


def _job_in_default(store) -> None:
    store.add_job("j" * 32, "old", DEFAULT, LEAD.name, LEAD.org, {}, ["server", "site-a"])


def test_without_named_studies_default_holds_everyone(store):
    studies = Studies(store)
    studies.seed(PROJECT)
    assert studies.exists(DEFAULT) and studies.default_open()
    assert studies.sites(DEFAULT) == ["site-a", "site-b"]
    assert studies.visible(LEAD) == [DEFAULT]
    studies.require_member(LEAD, DEFAULT)


def test_with_named_studies_there_is_no_default_to_cross_them(store):
    studies = Studies(store)
    studies.seed({**PROJECT, "studies": {"alpha": {"sites": ["site-a"], "admins": [LEAD.name]}}})
    assert not studies.exists(DEFAULT)
    assert studies.sites(DEFAULT) == [] and studies.visible(LEAD) == ["alpha"]
    with pytest.raises(Denied, match=r"no default study; choose yours with `atoll login --study "
                                     r"NAME`.*your studies: alpha"):
        studies.require_member(LEAD, DEFAULT)
    assert not studies.settle_default()  # no jobs in default: nothing to keep


def test_a_workspace_from_before_keeps_defaults_jobs_in_an_ordinary_study(store):
    studies = Studies(store)
    studies.seed({**PROJECT, "studies": {"alpha": {"sites": ["site-a"], "admins": [LEAD.name]}}})
    _job_in_default(store)
    assert studies.settle_default() and not studies.settle_default()
    assert studies.exists(DEFAULT) and studies.sites(DEFAULT) == []
    assert studies.can_see(ADMIN, DEFAULT) and not studies.can_see(LEAD, DEFAULT)
    ops = _ops(store)
    ops.add_user(ADMIN, DEFAULT, {"name": DEFAULT, "user": LEAD.name})  # managed like any other
    assert studies.can_see(LEAD, DEFAULT)
    with pytest.raises(Denied, match="still has 1 job"):
        ops.remove(ADMIN, DEFAULT, {"name": DEFAULT})


def test_creating_the_first_study_ends_the_open_default(store):
    studies = Studies(store)
    studies.seed(PROJECT)
    _job_in_default(store)
    ops = _ops(store)
    with pytest.raises(Denied, match="holds every site and user while the project has no"):
        ops.add_site(ADMIN, DEFAULT, {"name": DEFAULT, "site": "site-a"})
    with pytest.raises(ValueError, match="'default' is reserved"):
        ops.create(ADMIN, DEFAULT, {"name": DEFAULT})
    answer = ops.create(ADMIN, DEFAULT, {"name": "gamma", "sites": ["site-b"]})
    assert "study default keeps its jobs and has no members" in answer["note"]
    assert not studies.can_see(LEAD, DEFAULT) and studies.sites(DEFAULT) == []
    assert [e["action"] for e in store.audit_log()][-1] == "study_settle_default"
