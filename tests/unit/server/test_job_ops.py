"""The admin operations (server/job_ops.py, session_ops.py, download.py) as plain functions on
the in-memory store: real studies, a real session signer, no process, no gRPC."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from atoll.pki.identity import Identity
from atoll.server import download, job_ops, session_ops
from atoll.server.audit import Audit
from atoll.server.job_ops import JobOps, NoSuchJob
from atoll.server.sessions import SessionSigner
from atoll.server.site_policies import SitePolicies
from atoll.server.store import open_store
from atoll.server.studies import Denied, Studies

ADMIN = Identity("admin@x.org", "x", "admin", "project_admin")
LEAD = Identity("lead@a.org", "org-a", "admin", "lead")
OTHER = Identity("lead@b.org", "org-b", "admin", "lead")
ORG_ADMIN = Identity("boss@a.org", "org-a", "admin", "org_admin")
PROJECT = {"sites": [{"name": "site-a", "org": "org-a"}, {"name": "site-b", "org": "org-b"}],
           "users": [{"name": u.name, "org": u.org, "role": u.role}
                     for u in (ADMIN, LEAD, OTHER, ORG_ADMIN)],
           "studies": {"s": {"sites": ["site-a", "site-b"],
                             "admins": [LEAD.name, OTHER.name, ORG_ADMIN.name]},
                       "t": {"sites": ["site-a"], "admins": [LEAD.name]}}}


class Jobs:
    """What the operations ask of the job manager: its folders, and abort (which the real one
    ends in the store)."""

    def __init__(self, store, jobs_dir):
        self.store, self.jobs_dir, self.aborted = store, jobs_dir, []

    def abort(self, job_id, reason):
        self.aborted.append((job_id, reason))
        self.store.set_job_state(job_id, "FINISHED:ABORTED", reason)


class Links:
    def __init__(self, online=None):
        self._online = online or {}
        self.sent = []

    def send(self, site, kind, body):
        self.sent.append((site, kind, body))
        return site in self._online

    def send_all(self, sites, kind, body):
        return [site for site in sites if not self.send(site, kind, body)]

    def online(self):
        return dict(self._online)

    def get(self, site):
        return self._online.get(site)


@pytest.fixture
def deps(tmp_path):
    store = open_store(None)
    studies = Studies(store)
    studies.seed(PROJECT)
    links = Links({"site-a": SimpleNamespace(
        hello={"launcher": "process", "version": "0.1.0"}, org="org-a", capacity={"gpus": 2},
        running_jobs=["j", "b" * 32, "a" * 32], last_seen=time.monotonic() - 3)})
    yield JobOps(store=store, studies=studies, jobs=Jobs(store, tmp_path / "jobs"), links=links,
                 policies=SitePolicies(links), audit=Audit(store))
    store.close()


def _job(deps, job_id="a" * 32, study="s", who=LEAD):
    deps.store.add_job(job_id, "fedavg", study, who.name, who.org, {"name": "fedavg"},
                       ["server", "site-a"])
    return job_id


def test_a_job_of_another_study_is_no_such_job(deps):
    job = _job(deps, study="t")
    with pytest.raises(NoSuchJob) as raised:
        job_ops.job_status(deps, LEAD, "s", {"job_id": job})
    assert raised.value.detail == "the job is in study t"
    with pytest.raises(NoSuchJob) as raised:
        job_ops.job_status(deps, LEAD, "s", {"job_id": "nope"})
    assert raised.value.detail == "no such job"
    assert job_ops.job_status(deps, LEAD, "t", {"job_id": job})["job_id"] == job


def test_status_carries_the_version_to_wait_from_and_the_progress(deps):
    job = _job(deps)
    deps.store.add_event(job, "server", {"round": 1})
    out = job_ops.job_status(deps, LEAD, "s", {"job_id": job})
    assert out["version"] == deps.store.version and out["state"] == "SUBMITTED"
    assert [e["round"] for e in out["progress"]] == [1]
    assert job_ops.unfinished(deps, LEAD, "s", {"job_id": job})
    assert [j["job_id"] for j in job_ops.list_jobs(deps, LEAD, "s", {})["jobs"]] == [job]
    assert job_ops.list_jobs(deps, LEAD, "t", {})["jobs"] == []


def test_a_page_of_jobs_with_the_total_and_each_waiting_jobs_place_in_the_queue(deps):
    for n in range(5):
        _job(deps, f"{n:032d}")
    _job(deps, "f" * 32, study="t")  # another study's queue is not this one's
    deps.store.set_job_state(f"{3:032d}", "RUNNING")
    page = job_ops.list_jobs(deps, LEAD, "s", {"offset": 1, "limit": 3})
    assert page["total"] == 5 and page["offset"] == 1
    assert [(j["job_id"][-1], j.get("queue_position")) for j in page["jobs"]] == [
        ("3", None), ("2", 3), ("1", 2)]
    assert len(job_ops.list_jobs(deps, LEAD, "s", {})["jobs"]) == 5  # without offset: as before
    for bad in ({"offset": -1}, {"offset": "0"}, {"offset": 0, "limit": True}):
        with pytest.raises(ValueError, match="counts of jobs"):
            job_ops.list_jobs(deps, LEAD, "s", bad)


def test_only_a_manager_aborts_and_it_is_audited(deps):
    job = _job(deps)
    with pytest.raises(Denied, match="lead@b.org \\(lead\\) may not abort lead@a.org's job"):
        job_ops.abort_job(deps, OTHER, "s", {"job_id": job})
    assert deps.jobs.aborted == []
    out = job_ops.abort_job(deps, ORG_ADMIN, "s", {"job_id": job})  # the submitter's org admin
    assert out["state"] == "FINISHED:ABORTED"
    assert deps.jobs.aborted == [(job, "aborted by boss@a.org")]
    [entry] = deps.store.audit_log()
    assert (entry["user"], entry["action"], entry["target"], entry["outcome"]) == (
        ORG_ADMIN.name, "abort", job, "ok")


def test_a_site_policy_narrows_what_the_roles_allow(deps):
    job = _job(deps)
    deps.links._online["site-a"].hello = {"launcher": "process", "authorization": {
        "format_version": "1.0",
        "permissions": {"project_admin": {"manage_job": "none", "download_job": "none"}}}}
    with pytest.raises(Denied, match="may not abort lead@a.org's job: "):
        job_ops.abort_job(deps, ADMIN, "s", {"job_id": job})
    with pytest.raises(Denied, match="may not download lead@a.org's job: "):
        download.authorize(deps, ADMIN, "s", {"job_id": job})


def test_delete_only_a_finished_job_and_its_folder(deps):
    job = _job(deps)
    (deps.jobs.jobs_dir / job).mkdir(parents=True)
    with pytest.raises(ValueError, match="is SUBMITTED; abort it first"):
        job_ops.delete_job(deps, LEAD, "s", {"job_id": job})
    deps.store.set_job_state(job, "FINISHED:COMPLETED")
    assert job_ops.delete_job(deps, LEAD, "s", {"job_id": job}) == {"deleted": job,
                                                                    "name": "fedavg"}
    assert deps.store.get_job(job) is None and not (deps.jobs.jobs_dir / job).exists()
    assert "submitter=lead@a.org state=FINISHED:COMPLETED" in deps.store.audit_log()[-1]["detail"]
    # each site of the job is told to forget it (an offline one: retention removes the rest)
    assert deps.links.sent == [("site-a", "forget", {"job_id": job})]


def test_logs_read_only_inside_the_jobs_folder(deps):
    job = _job(deps)
    logs = deps.jobs.jobs_dir / job / "logs"
    logs.mkdir(parents=True)
    (logs / "site-a.log").write_text("trained\n")
    (logs / "site-b.log").symlink_to("/etc/passwd")
    out = job_ops.job_logs(deps, LEAD, "s", {"job_id": job})
    assert out["logs"]["site-a"] == "trained\n"
    assert out["logs"]["site-b"].startswith("[atoll: the server did not read this log")
    assert "root:" not in out["logs"]["site-b"]


def test_logs_carry_each_parts_state_changes_for_the_jobs_study_alone(deps):
    job = _job(deps)
    deps.store.set_part_state(job, "site-a", "RUNNING", "worker started")
    out = job_ops.job_logs(deps, LEAD, "s", {"job_id": job})
    assert [(h["part"], h["state"], h["reason"]) for h in out["part_history"]] == [
        ("server", "SUBMITTED", ""), ("site-a", "SUBMITTED", ""),
        ("site-a", "RUNNING", "worker started")]
    with pytest.raises(NoSuchJob):
        job_ops.job_logs(deps, LEAD, "t", {"job_id": job})


def test_sites_of_the_study_with_what_the_online_ones_reported(deps):
    _job(deps, "a" * 32, study="s")
    _job(deps, "b" * 32, study="t")  # another study's job: counted, never named
    _job(deps, "c" * 32, study="s")
    deps.store.set_job_state("c" * 32, "FINISHED:COMPLETED")  # the site has not said it yet
    deps.links.get("site-a").running_jobs.append("c" * 32)
    answer = job_ops.list_sites(deps, LEAD, "s", {})
    assert 3 <= answer["sites"][0].pop("heartbeat_s_ago") < 3600
    assert answer == {"study": "s", "sites": [
        {"name": "site-a", "online": True, "launcher": "process", "capacity": {"gpus": 2},
         "running_jobs": 4, "version": "0.1.0", "study_jobs": ["a" * 32],
         "other_study_jobs": 2},
        {"name": "site-b", "online": False, "launcher": None, "capacity": None,
         "running_jobs": 0}]}


def test_the_audit_log_is_for_project_admins(deps):
    deps.audit.record(LEAD, "s", "submit", "x", "ok")
    with pytest.raises(Denied, match="only project admins"):
        job_ops.audit_log(deps, LEAD, "s", {})
    with pytest.raises(ValueError, match="limit a number"):
        job_ops.audit_log(deps, ADMIN, "s", {"limit": "all"})
    assert [e["target"] for e in job_ops.audit_log(deps, ADMIN, "s", {})["entries"]] == ["x"]


def test_refusals_are_counted_not_repeated(deps):
    for _ in range(3):
        deps.audit.refused(OTHER, "f" * 64, "s", "abort", "j", "may not")
    entries = deps.store.audit_log()
    assert len(entries) == 1 and entries[0]["outcome"] == "refused"


def test_download_needs_the_study_and_a_manager(deps, tmp_path):
    job = _job(deps)
    with pytest.raises(Denied):
        download.authorize(deps, OTHER, "t", {"job_id": job})  # not in study t
    with pytest.raises(Denied, match="may not download"):
        download.authorize(deps, OTHER, "s", {"job_id": job})
    assert download.authorize(deps, LEAD, "s", {"job_id": job}).id == job


def test_login_signs_a_session_for_a_member_only(deps, tmp_path):
    signer = SessionSigner(tmp_path / "session.key")
    ops = session_ops.ops(session_ops.SessionOps(deps.studies, signer, deps.audit))
    out = ops["login"](LEAD, "t", {})
    grant = signer.check(out["token"], LEAD.name)
    assert grant is not None and grant.study == "t" and out["role"] == "lead"
    with pytest.raises(Denied):
        ops["login"](OTHER, "t", {})
    assert ops["whoami"](LEAD, "s", {})["studies"] == ["s", "t"]


def test_a_status_is_read_again_only_once_the_store_changed(deps, monkeypatch):
    job = _job(deps)
    reads = []
    get_job = deps.store.get_job
    monkeypatch.setattr(deps.store, "get_job", lambda job_id: reads.append(job_id)
                        or get_job(job_id))
    first = job_ops.job_status(deps, LEAD, "s", {"job_id": job})
    first["state"] = "changed by its caller"  # a copy: the next caller does not see it
    again = job_ops.job_status(deps, LEAD, "s", {"job_id": job})
    assert len(reads) == 1 and again["state"] == "SUBMITTED"
    assert again["version"] == deps.store.version
    deps.store.add_event(job, "server", {"round": 1})  # any write: read again
    after = job_ops.job_status(deps, LEAD, "s", {"job_id": job})
    assert len(reads) == 2 and [e["round"] for e in after["progress"]] == [1]
    deps.store.set_job_state(job, "RUNNING")
    assert job_ops.job_status(deps, LEAD, "s", {"job_id": job})["state"] == "RUNNING"
    # what another study's member is told does not depend on what was asked before
    with pytest.raises(NoSuchJob) as raised:
        job_ops.job_status(deps, LEAD, "t", {"job_id": job})
    assert raised.value.detail == "the job is in study s"


def test_the_status_cache_keeps_the_jobs_asked_about_last():
    cache = job_ops.StatusCache()
    for n in range(cache.SIZE + 1):
        cache.put(f"{n:032d}", 1, "s", {"n": n})
    assert cache.get(f"{0:032d}", 1) is None  # the oldest gone
    assert cache.get(f"{cache.SIZE:032d}", 1) == ("s", {"n": cache.SIZE})
    assert cache.get(f"{cache.SIZE:032d}", 2) is None  # read at another version
