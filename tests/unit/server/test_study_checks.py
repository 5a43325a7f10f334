"""Each study check of the server, on a real store, without a federation: who is a member of a
study (server/studies.py) and who may change one (server/study_ops.py). The same refusals over
the Admin API are in tests/integration/federation/test_studies.py."""

from __future__ import annotations

import pytest

from atoll.pki.identity import Identity
from atoll.server.sqlite_store import SqliteStore
from atoll.server.studies import Denied, NoSuchStudy, Studies
from atoll.server.study_ops import StudyOps

ADMIN = Identity("admin@x.org", "x", "admin", "project_admin")
LEAD_A = Identity("lead@a.org", "org-a", "admin", "lead")
LEAD_B = Identity("lead@b.org", "org-b", "admin", "lead")
BOSS_A = Identity("boss@a.org", "org-a", "admin", "org_admin")
BOSS_B = Identity("boss@b.org", "org-b", "admin", "org_admin")


def _no_certificate(pem: bytes) -> Identity:
    raise ValueError("these tests send no certificate")


@pytest.fixture
def ops(tmp_path):
    store = SqliteStore(tmp_path / "atoll.db")
    store.upsert_participant("site-a", "site", "org-a")
    store.upsert_participant("site-b", "site", "org-b")
    for who in (ADMIN, LEAD_A, LEAD_B, BOSS_A, BOSS_B):
        store.upsert_participant(who.name, "admin", who.org, who.role)
    ops = StudyOps(Studies(store), store, _no_certificate)
    ops.create(ADMIN, "default", {"name": "alpha", "sites": ["site-a"], "users": [LEAD_A.name]})
    ops.create(ADMIN, "default", {"name": "beta", "sites": ["site-b"], "users": [LEAD_B.name]})
    yield ops
    store.close()


def test_a_member_is_let_in_and_a_non_member_refused_alike_for_absent(ops):
    studies = ops.studies
    studies.require_member(LEAD_A, "alpha")
    with pytest.raises(Denied, match="lead@b.org is not a member of study 'alpha'") as hidden:
        studies.require_member(LEAD_B, "alpha")
    with pytest.raises(Denied) as absent:
        studies.require_member(LEAD_B, "gamma")
    assert str(absent.value) == str(hidden.value).replace("'alpha'", "'gamma'").replace(
        "add-user alpha", "add-user gamma")
    assert not studies.can_see(LEAD_B, "alpha") and studies.can_see(LEAD_B, "beta")
    assert studies.visible(LEAD_A) == ["alpha"]


def test_a_project_admin_sees_every_study_and_is_told_which_is_absent(ops):
    ops.studies.require_member(ADMIN, "beta")
    with pytest.raises(NoSuchStudy, match="no such study: gamma"):
        ops.studies.require_member(ADMIN, "gamma")
    assert not ops.studies.can_see(ADMIN, "gamma")
    with pytest.raises(Denied, match="no such study: gamma"):
        ops.show(ADMIN, "alpha", {"name": "gamma"})


def test_a_removed_study_is_no_ones_any_more(ops):
    ops.remove(ADMIN, "beta", {"name": "beta"})
    for who in (ADMIN, LEAD_B, BOSS_B):
        assert not ops.studies.can_see(who, "beta")
        assert "beta" not in ops.studies.visible(who)


def test_an_org_admin_sees_only_the_studies_of_their_orgs_sites(ops):
    studies = ops.studies
    studies.require_member(BOSS_A, "alpha")
    with pytest.raises(Denied, match="not a member of study 'beta'"):
        studies.require_member(BOSS_A, "beta")
    assert studies.visible(BOSS_B) == ["beta"]


def test_with_named_studies_a_session_without_one_is_refused(ops):
    with pytest.raises(Denied, match="no default study"):
        ops.studies.require_member(LEAD_A, "default")


def test_only_a_project_admin_creates_or_removes_a_study(ops):
    for who in (LEAD_A, BOSS_A):
        with pytest.raises(Denied, match="may not create studies"):
            ops.create(who, "alpha", {"name": "gamma"})
        with pytest.raises(Denied, match="may not remove study alpha"):
            ops.remove(who, "alpha", {"name": "alpha"})
    assert ops.store.studies() == ["alpha", "beta"]


def test_a_study_name_is_checked_and_not_made_twice(ops):
    for bad in ("Alpha", "../x", "-a", "a" * 64, ""):
        with pytest.raises(ValueError, match="is invalid"):
            ops.create(ADMIN, "alpha", {"name": bad})
    with pytest.raises(ValueError, match="already exists"):
        ops.create(ADMIN, "alpha", {"name": "alpha"})


def test_a_study_with_jobs_is_not_removed(ops):
    ops.store.add_job("j" * 32, "job", "alpha", LEAD_A.name, LEAD_A.org, {}, ["server", "site-a"])
    with pytest.raises(Denied, match="still has 1 job"):
        ops.remove(ADMIN, "alpha", {"name": "alpha"})
    assert "alpha" in ops.store.studies()


def test_a_lead_cannot_change_a_studys_members(ops):
    with pytest.raises(Denied, match="may not change the users of study alpha"):
        ops.add_user(LEAD_A, "alpha", {"name": "alpha", "user": LEAD_B.name})
    with pytest.raises(Denied, match="may not change the users of study alpha"):
        ops.add_user(LEAD_A, "alpha", {"name": "alpha", "user": BOSS_A.name})  # their own org
    with pytest.raises(Denied, match="may not change the users of study alpha"):
        ops.remove_user(LEAD_A, "alpha", {"name": "alpha", "user": LEAD_A.name})
    with pytest.raises(Denied, match="may not change the sites of study alpha"):
        ops.add_site(LEAD_A, "alpha", {"name": "alpha", "site": "site-b"})
    assert ops.studies.users("alpha") == [LEAD_A.name]
    assert ops.studies.sites("alpha") == ["site-a"]


def test_an_org_admin_changes_only_their_own_orgs_members_in_studies_they_see(ops):
    added = ops.add_user(BOSS_A, "alpha", {"name": "alpha", "user": BOSS_A.name})
    assert BOSS_A.name in added["users"]
    with pytest.raises(Denied, match="may not change the sites of study alpha"):
        ops.add_site(BOSS_A, "alpha", {"name": "alpha", "site": "site-b"})  # org-b's site
    with pytest.raises(Denied, match="may not change the users of study beta"):
        ops.add_user(BOSS_A, "beta", {"name": "beta", "user": LEAD_A.name})  # a study unseen
    assert ops.studies.sites("alpha") == ["site-a"] and ops.studies.users("beta") == [LEAD_B.name]


class _Jobs:
    def __init__(self):
        self.dispatched = []

    def held(self):
        return {}

    def dispatch(self, record, meta, sites, skipped, resources):
        self.dispatched.append((record.id, sites, skipped))

    def abort(self, job_id, reason):
        raise AssertionError(f"aborted: {reason}")


def test_the_scheduler_never_dispatches_to_a_site_outside_the_study(tmp_path):
    from types import SimpleNamespace

    from atoll.server.scheduler import JobQueue, Scheduler

    store = SqliteStore(tmp_path / "atoll.db")
    try:
        jobs = _Jobs()
        online = {s: SimpleNamespace(capacity={}, launcher="process") for s in ("site-a", "site-b")}
        links = SimpleNamespace(online=lambda: online)
        studies = SimpleNamespace(sites=lambda study: ["site-a"] if study == "alpha" else [])
        meta = {"name": "fedavg", "deploy_map": {"app": ["server", "site-a", "site-b"]}}
        store.add_job("a" * 32, "fedavg", "alpha", "lead", "org", meta, ["server", "site-a"])
        Scheduler(JobQueue(), store, studies, links, jobs).tick()
        assert jobs.dispatched == [("a" * 32, ["site-a"], {
            "site-b": "not dispatched: no longer enrolled in study alpha"})]
    finally:
        store.close()


def test_intake_refuses_a_mandatory_site_outside_the_study():
    from atoll.spec.admission import study_issues
    from atoll.spec.meta import load_meta

    meta = load_meta({"name": "fedavg", "deploy_map": {"app": ["@ALL"]},
                      "mandatory_clients": ["site-b"]})
    assert [(i.path, i.message) for i in study_issues(meta, "alpha", ["site-a"])] == [
        ("mandatory_clients[0]", "site 'site-b' is not enrolled in study 'alpha' (its sites: "
         "site-a); the job could never start")]
    assert study_issues(meta, "alpha", ["site-a", "site-b"]) == []
