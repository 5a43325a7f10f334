"""Signed jobs and site policies on a real federation (server and sites as processes, real
mutual TLS, real kits): a job changed after it was signed never runs anywhere, and each site
decides by its own local/authorization.json who runs code on its hardware.

site-a keeps the provisioned default policy; site-b lets leads run nothing and download
nothing; site-c runs only code its operator approved.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import pytest

from atoll.admin.errors import Refused
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import ECHO, make_job
from tests.integration.federation.zips import job_zip, signed, submit

ADMIN, LEAD = "admin@consortium.org", "lead@site-a.org"
USERS = [{"name": ADMIN, "org": "consortium", "role": "project_admin"},
         {"name": LEAD, "org": "org-site-a", "role": "lead"}]
SITE_B_POLICY = {"format_version": "1.0", "permissions": {
    "project_admin": "any",
    "lead": {"submit_job": "none", "byoc": "none", "manage_job": "n:submitter",
             "download_job": "none"}}}
SITE_C_POLICY = {"format_version": "1.0", "permissions": {"project_admin": "any", "lead": "any"},
                 "code_approval": "required"}
NEEDLE = "TAMPERED-7c1e9"  # in the code the server's store gets, never in a site's files
TAMPERED = f'''
import os
open(os.path.join(os.environ["ATOLL_WORKDIR"], "{NEEDLE}"), "w").write("ran")
''' + ECHO


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("signed"),
                                 ["site-a", "site-b", "site-c"], USERS)
    for site, policy in (("site-b", SITE_B_POLICY), ("site-c", SITE_C_POLICY)):
        (fed.kit(site) / "local" / "authorization.json").write_text(json.dumps(policy))
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _part(job, site):
    return job["parts"][site]["state"], job["parts"][site]["reason"]


def _wait_state(session, job_id, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        job = session.status(job_id)
        if predicate(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def test_a_job_changed_in_the_servers_store_is_refused_and_never_runs(fed, tmp_path):
    fed.kill("site-a")  # the job waits for site-a in the server's store...
    with fed.session(LEAD) as s:
        job_id = s.submit(make_job(tmp_path / "victim", sites=["site-a"]))["job_id"]
        _wait_state(s, job_id, lambda j: "waiting for sites" in j["reason"])
        stored = fed.workspace("server") / "jobs" / job_id / "job" / "app" / "train.py"
        stored.write_text(TAMPERED)  # ...where whoever holds the server changes its code
        fed.start_site("site-a")
        job = s.wait(job_id, timeout=120)
    state, reason = _part(job, "site-a")
    assert state == "FINISHED:FAILED"
    assert "does not match lead@site-a.org's signature (changed after it was signed: " \
           "app/train.py)" in reason
    assert "nothing of it ran here" in reason
    site_files = [p for p in fed.workspace("site-a").rglob("*") if p.is_file()]
    assert not any(NEEDLE in p.name or NEEDLE.encode() in p.read_bytes() for p in site_files)
    assert not (fed.workspace("site-a") / "jobs" / job_id / "app").exists()


def test_a_site_whose_policy_denies_the_role_refuses_naming_the_rule(fed, tmp_path):
    with fed.session(LEAD) as s:
        job = s.submit(make_job(tmp_path / "lead-job", sites=["site-a", "site-b"],
                                min_clients=1), wait=True, timeout=120)
        assert job["state"] == "FINISHED:COMPLETED", job
        assert _part(job, "site-a")[0] == "FINISHED:COMPLETED"
        state, reason = _part(job, "site-b")
        assert state == "FINISHED:FAILED"
        assert "site-b refused the job by its policy (rule permissions.lead.submit_job)" in reason
        assert "lead@site-a.org (role lead, org org-site-a)" in reason
        # download_job: site-b's rule, enforced by the server for it
        with pytest.raises(Refused, match=r"site site-b refuses \(rule "
                                          r"permissions.lead.download_job\)"):
            s.download(job["job_id"], tmp_path / "out")
    with fed.session(ADMIN) as s:
        assert s.download(job["job_id"], tmp_path / "admin-out").is_dir()
        job = s.submit(make_job(tmp_path / "admin-job", sites=["site-b"]), wait=True,
                       timeout=120)
    assert job["state"] == "FINISHED:COMPLETED", job  # project_admin: "any" at site-b


def test_a_site_in_code_approval_mode_runs_only_approved_jobs(fed, tmp_path):
    folder = make_job(tmp_path / "reviewed", sites=["site-c"])
    with fed.session(ADMIN) as s:
        job = s.submit(folder, wait=True, timeout=120)
        state, reason = _part(job, "site-c")
        assert state == "FINISHED:FAILED"
        assert "site-c runs only jobs its operator approved" in reason
        digest = reason.split("this job's content ")[1].split(" ")[0]
        assert digest.startswith("sha256:")
        assert "atoll site approve <kit of site-c> JOB_DIR" in reason
        approved = subprocess.run(
            [sys.executable, "-m", "atoll", "site", "approve", str(fed.kit("site-c")),
             str(folder), "--format", "json"], capture_output=True, text=True, timeout=60)
        assert approved.returncode == 0, approved.stderr
        assert json.loads(approved.stdout)["digest"] == digest
        job = s.submit(folder, wait=True, timeout=120)
        assert job["state"] == "FINISHED:COMPLETED", job
        (folder / "app" / "train.py").write_text(ECHO + "\n# one more line\n")
        job = s.submit(folder, wait=True, timeout=120)  # changed since review: not approved
        assert "runs only jobs its operator approved" in _part(job, "site-c")[1]


def test_the_server_takes_only_jobs_signed_by_their_submitter_for_their_study(fed):
    data = job_zip({"name": "raw", "deploy_map": {"app": ["server", "site-a"]}})
    with fed.session(ADMIN) as admin, fed.session(LEAD) as lead:
        cases = [
            (admin, data, "the job is not signed"),
            (admin, signed(data, lead), "it was signed by lead@site-a.org (lead, "
                                        "org-site-a), not by you (admin@consortium.org)"),
            (lead, signed(data, lead, study="other"),
             "signed for study 'other' and submitted in study 'default'"),
        ]
        for session, data, expected in cases:
            code, details = submit(session, data)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert expected in details
        entries = admin.call("audit")["entries"]
    refused = [e for e in entries if e["action"] == "submit" and e["outcome"] == "refused"]
    assert any("not signed" in e["detail"] for e in refused)
