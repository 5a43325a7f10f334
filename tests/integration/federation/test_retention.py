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
