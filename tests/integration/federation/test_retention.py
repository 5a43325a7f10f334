"""Run-folder retention at a real site parent (docs/operations.md, Cleaning up): with
`retention: {run_folders_days: N}` in local/site.yaml, the site removes at start the run
folders of jobs that finished more than N days ago, and keeps the others."""

from __future__ import annotations

import os
import time

from tests.integration.federation.harness import Federation, wait_for

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]


def test_a_site_removes_the_run_folders_older_than_its_retention(tmp_path):
    fed = Federation.provisioned(tmp_path, ["site-1"], USERS)
    site = fed.kit("site-1") / "local" / "site.yaml"
    site.write_text(site.read_text() + "\nretention: {run_folders_days: 7}\n")
    jobs = fed.workspace("site-1") / "jobs"
    for job_id, age_days in (("old-job", 30), ("recent-job", 1)):
        (jobs / job_id / "logs").mkdir(parents=True)
        (jobs / job_id / "logs" / "worker.log").write_text("finished\n")
        then = time.time() - age_days * 86400
        for path in (jobs / job_id / "logs" / "worker.log", jobs / job_id / "logs",
                     jobs / job_id):
            os.utime(path, (then, then))
    try:
        fed.start_all()
        fed.wait_online(ADMIN)
        wait_for(lambda: not (jobs / "old-job").exists(), 60, what="the old run folder to go")
        assert (jobs / "recent-job" / "logs" / "worker.log").exists()
    finally:
        fed.stop_all()
    assert "removed the run folders of 1 job(s) finished more than 7 days ago: old-job" in \
        fed.log("site-1")


def test_job_delete_removes_the_run_folder_at_each_site_that_ran_it(tmp_path):
    from tests.integration.federation.jobs import make_job

    fed = Federation.provisioned(tmp_path / "fed", ["site-1", "site-2"], USERS)
    try:
        fed.start_all()
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as s:
            done = s.submit(make_job(tmp_path / "job"), wait=True, timeout=180)
            assert done["state"] == "FINISHED:COMPLETED", done
            folders = [fed.workspace(site) / "jobs" / done["job_id"]
                       for site in ("site-1", "site-2")]
            assert all(f.is_dir() for f in folders)
            s.delete(done["job_id"])
        wait_for(lambda: not any(f.exists() for f in folders), 60,
                 what="both sites to remove the deleted job's run folder")
        assert not (fed.workspace("server") / "jobs" / done["job_id"]).exists()
    finally:
        fed.stop_all()
    for site in ("site-1", "site-2"):
        assert f"job {done['job_id']} was deleted at the server" in fed.log(site)
