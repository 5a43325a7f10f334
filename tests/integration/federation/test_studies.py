"""Studies on a real federation: two studies over three sites, site-b enrolled in both.

alpha = {site-a, site-b}, beta = {site-b, site-c}; site-b maps only alpha in its
study_runtime.yaml, so it must refuse beta's jobs itself.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from atoll.admin.errors import NotFound, Refused
from tests.integration.federation.harness import Federation, job_folder

ADMIN, LEAD_A, LEAD_B = "admin@consortium.org", "lead@a.org", "lead@b.org"
ORG_ADMIN_A, MEMBER_A = "orgadmin@a.org", "member@a.org"
SECRET = "s3cr3t-Value-7f9e2c41"
USERS = [
    {"name": ADMIN, "org": "consortium", "role": "project_admin"},
    {"name": LEAD_A, "org": "org-site-a", "role": "lead"},
    {"name": LEAD_B, "org": "org-site-c", "role": "lead"},
    {"name": ORG_ADMIN_A, "org": "org-site-a", "role": "org_admin"},
    {"name": MEMBER_A, "org": "org-site-a", "role": "member"},
]
STUDIES = {
    "alpha": {"sites": ["site-a", "site-b"], "admins": [LEAD_A, MEMBER_A]},
    "beta": {"sites": ["site-b", "site-c"], "admins": [LEAD_B]},
}
RUNTIME_A = """format_version: 2
studies:
  alpha:
    secret_env:
      DB_PASSWORD: {source: env, key: ALPHA_DB_PASSWORD}
"""
RUNTIME_B = "format_version: 2\nstudies:\n  alpha: {}\n"
RUNTIME_C = "format_version: 2\nstudies:\n  beta: {}\n"

SITE_SCRIPT = f'''
import hashlib, os
import atoll.client as fl

# The study maps DB_PASSWORD at site-a only; prove it arrived without ever printing it.
if fl.site_name() == "site-a":
    got = hashlib.sha256(os.environ["DB_PASSWORD"].encode()).hexdigest()
    assert got == "{hashlib.sha256(SECRET.encode()).hexdigest()}", "wrong secret"
fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={{"ok": 1.0}}))
'''
APP_YAML = "server:\n  workflow: scatter_gather\n  args: {num_rounds: 1}\nsite:\n  script: train.py\n"


def _job(tmp_path, name, deploy):
    return job_folder(tmp_path / name, {"name": name, "deploy_map": {"app": deploy}},
                      APP_YAML, {"train.py": SITE_SCRIPT})


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(
        tmp_path_factory.mktemp("studies"), ["site-a", "site-b", "site-c"], USERS, STUDIES,
        runtime={"site-a": RUNTIME_A, "site-b": RUNTIME_B, "site-c": RUNTIME_C})
    fed.start_server()
    fed.start_site("site-a", env={"ALPHA_DB_PASSWORD": SECRET})
    fed.start_site("site-b")
    fed.start_site("site-c")
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def alpha_job(fed, tmp_path_factory):
    with fed.session(LEAD_A, study="alpha") as s:
        job = s.submit(_job(tmp_path_factory.mktemp("jobs"), "alpha-all", ["@ALL"]), wait=True,
                       timeout=120)
    return job


def test_login_refuses_a_user_outside_the_study(fed):
    with pytest.raises(Refused, match=r"lead@b.org is not a member of study 'alpha'"):
        fed.session(LEAD_B, study="alpha")


def test_all_means_the_study_sites_and_secrets_arrive(alpha_job):
    assert alpha_job["state"] == "FINISHED:COMPLETED", (alpha_job["reason"], alpha_job["parts"])
    assert set(alpha_job["parts"]) == {"server", "site-a", "site-b"}
    assert alpha_job["study"] == "alpha"


def test_other_study_jobs_answer_no_such_job(fed, alpha_job, tmp_path):
    job_id = alpha_job["job_id"]
    with fed.session(LEAD_B, study="beta") as s:
        assert job_id not in {j["job_id"] for j in s.list_jobs()}
        messages = []
        for call in (s.status, s.logs, s.abort, lambda j: s.download(j, tmp_path)):
            for target in (job_id, "0" * 32):
                with pytest.raises(NotFound) as err:
                    call(target)
                messages.append(str(err.value).replace(target, "<id>"))
        assert set(messages) == {"no such job: <id>"}
    with fed.session(LEAD_A, study="alpha") as s:
        assert job_id in {j["job_id"] for j in s.list_jobs()}


def test_submit_to_a_site_outside_the_study_is_refused_before_any_site(fed, tmp_path):
    site_jobs = fed.workspace("site-a") / "jobs"
    seen_by_site = sorted(site_jobs.iterdir()) if site_jobs.exists() else []
    with fed.session(LEAD_B, study="beta") as s:
        before = {j["job_id"] for j in s.list_jobs()}
        with pytest.raises(Refused, match=r"site 'site-a' is not enrolled in study 'beta'"):
            s.submit(_job(tmp_path, "outside", ["server", "site-a"]))
        assert {j["job_id"] for j in s.list_jobs()} == before
    assert (sorted(site_jobs.iterdir()) if site_jobs.exists() else []) == seen_by_site
    assert not list((fed.workspace("server") / "tmp").iterdir())  # nothing left behind


def test_a_site_that_does_not_map_the_study_refuses_its_job(fed, tmp_path):
    with fed.session(LEAD_B, study="beta") as s:
        job = s.submit(_job(tmp_path, "beta-all", ["@ALL"]), wait=True, timeout=120)
    assert set(job["parts"]) == {"server", "site-b", "site-c"}
    refusal = job["parts"]["site-b"]
    assert refusal["state"] == "FINISHED:FAILED"
    assert "site site-b does not map study 'beta'" in refusal["reason"]


def test_site_list_shows_only_enrolled_sites(fed):
    with fed.session(LEAD_B, study="beta") as s:
        assert {x["name"] for x in s.sites()["sites"]} == {"site-b", "site-c"}


def test_default_study_does_not_cross_study_boundaries(fed, alpha_job, tmp_path):
    """A project with named studies has no `default` that everybody is in: a member of beta
    neither sees alpha's sites (nor their running jobs) nor runs jobs there through it."""
    no_default = "this federation has named studies and no default study"
    with pytest.raises(Refused, match=no_default + r".*your studies: beta"):
        fed.session(LEAD_B, study="default")
    with fed.session(LEAD_B) as s:  # no session: every call asks for `default`
        assert s.whoami  # the channel works; the calls below are refused by the server
        for call in (s.sites, s.list_jobs, lambda: s.sites("default")):
            with pytest.raises(Refused, match=no_default):
                call()
        with pytest.raises(Refused, match=no_default):
            s.submit(_job(tmp_path, "via-default", ["server", "site-a"]), study="default")
    with fed.session(LEAD_B, study="beta") as s:
        assert alpha_job["job_id"] not in {j["job_id"] for j in s.list_jobs()}
        assert "default" not in s.whoami()["studies"]


def test_secret_values_never_reach_the_server(fed, alpha_job):
    needle = SECRET.encode()
    for path in fed.workspace("server").rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), path
    for path in (fed.workspace("site-a") / "jobs").rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), path
    with fed.session(ADMIN, study="alpha") as s:
        answers = [s.status(alpha_job["job_id"]), s.logs(alpha_job["job_id"]), s.list_jobs()]
    assert SECRET not in json.dumps(answers)


def test_study_commands_follow_roles(fed):
    with fed.session(MEMBER_A) as s:
        with pytest.raises(Refused, match="may not create studies"):
            s.call("study_create", name="gamma", sites=["site-a"])
        assert [x["name"] for x in s.call("study_list")["studies"]] == ["alpha"]
        with pytest.raises(Refused, match="may not change the sites of study alpha"):
            s.call("study_remove_site", name="alpha", site="site-a")
    with fed.session(ORG_ADMIN_A) as s:
        with pytest.raises(Refused, match="no such study: beta"):
            s.call("study_show", name="beta")
        with pytest.raises(Refused, match="may not change the sites of study alpha"):
            s.call("study_remove_site", name="alpha", site="site-b")  # another org's site
        assert s.call("study_remove_user", name="alpha", user=MEMBER_A)["users"] == [LEAD_A]
        assert MEMBER_A in s.call("study_add_user", name="alpha", user=MEMBER_A)["users"]
    with fed.session(ADMIN) as s:
        created = s.call("study_create", name="gamma", sites=["site-a", "site-c"], users=[LEAD_B])
        assert created == {"name": "gamma", "sites": ["site-a", "site-c"], "users": [LEAD_B],
                           "jobs": 0}
        with pytest.raises(Refused, match="'nobody' is not a provisioned site"):
            s.call("study_add_site", name="gamma", site="nobody")
        with pytest.raises(Refused, match="study 'gamma' already exists"):
            s.call("study_create", name="gamma")
        with pytest.raises(Refused, match="study name 'Bad Name' is invalid"):
            s.call("study_create", name="Bad Name")
        with pytest.raises(Refused, match="no such study: default"):  # named studies: none
            s.call("study_add_site", name="default", site="site-a")
        assert s.call("study_remove", name="gamma") == {"removed": "gamma"}
        with pytest.raises(Refused, match=r"study alpha still has \d+ job\(s\)"):
            s.call("study_remove", name="alpha")


def test_audit_log_records_who_did_what(fed, alpha_job, tmp_path):
    with fed.session(LEAD_A, study="alpha") as s:
        s.download(alpha_job["job_id"], tmp_path)
        with pytest.raises(Refused, match="only project admins may read the audit log"):
            s.call("audit")
    with fed.session(ADMIN) as s:
        entries = s.call("audit")["entries"]
    seen = {(e["user"], e["study"], e["action"], e["outcome"]) for e in entries}
    assert (LEAD_A, "alpha", "login", "ok") in seen
    assert (LEAD_B, "alpha", "login", "refused") in seen
    assert (LEAD_A, "alpha", "submit", "ok") in seen
    assert (LEAD_A, "alpha", "download", "ok") in seen
    assert (ADMIN, "gamma", "study_create", "ok") in seen


def test_job_delete_follows_roles_and_refuses_a_running_job(fed, alpha_job, tmp_path):
    from tests.integration.federation.jobs import STALL

    with fed.session(LEAD_B, study="beta") as s:  # another study's job: as if absent
        with pytest.raises(NotFound, match="no such job"):
            s.delete(alpha_job["job_id"])
    with fed.session(LEAD_A, study="alpha") as s:
        stalls = job_folder(tmp_path / "stalls", {"name": "stalls", "deploy_map": {
            "app": ["@ALL"]}}, APP_YAML, {"train.py": STALL})
        job_id = s.submit(stalls)["job_id"]
        with pytest.raises(Refused, match="abort it first"):
            s.delete(job_id)
    with fed.session(MEMBER_A, study="alpha") as s:
        with pytest.raises(Refused, match="may not delete lead@a.org's job"):
            s.delete(job_id)
    with fed.session(LEAD_A, study="alpha") as s:
        s.abort(job_id)
        s.wait(job_id, timeout=60)
        assert s.delete(job_id) == {"deleted": job_id, "name": "stalls"}
        with pytest.raises(NotFound):
            s.status(job_id)
    with fed.session(ADMIN, study="alpha") as s:
        entries = s.call("audit", only_study="alpha")["entries"]
    assert [(e["user"], e["outcome"]) for e in entries
            if e["action"] == "delete" and e["target"] == job_id] == [
        (MEMBER_A, "refused"), (LEAD_A, "ok")]
