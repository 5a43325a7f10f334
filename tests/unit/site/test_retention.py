"""A site's retention of run folders (site/retention.py) on real folders: what is old goes, what
runs, is fresh, is not a run folder or is a planted link stays."""

from __future__ import annotations

import os
import time

from atoll.site.retention import expired, sweep

DAY = 86400.0


def _run_folder(jobs, job_id, age_days, log_age_days=None):
    folder = jobs / job_id
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "worker.log").write_text("done\n")
    (folder / "app").mkdir()
    then = time.time() - age_days * DAY
    log_then = time.time() - (age_days if log_age_days is None else log_age_days) * DAY
    os.utime(folder / "logs" / "worker.log", (log_then, log_then))
    for path in (folder / "app", folder / "logs", folder):
        os.utime(path, (then, then))
    return folder


def test_old_finished_run_folders_go_with_their_app_zip_and_the_rest_stays(tmp_path):
    jobs, apps = tmp_path / "jobs", tmp_path / "apps"
    apps.mkdir()
    old = _run_folder(jobs, "old-job", 20)
    (apps / "old-job.zip").write_bytes(b"zip")
    running = _run_folder(jobs, "running-job", 20)
    fresh = _run_folder(jobs, "fresh-job", 2)
    late_log = _run_folder(jobs, "late-log", 20, log_age_days=1)  # wrote its log yesterday
    stranger = jobs / "not a job id"
    stranger.mkdir()
    os.utime(stranger, (0, 0))
    # a link named like a job, planted toward a folder that must survive
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("x")
    os.symlink(precious, jobs / "linked-job")

    assert [p.name for p in expired(jobs, 14, ["running-job"])] == ["old-job"]
    assert sweep(jobs, apps, 14, ["running-job"]) == ["old-job"]
    assert not old.exists() and not (apps / "old-job.zip").exists()
    assert running.exists() and fresh.exists() and late_log.exists() and stranger.exists()
    assert (precious / "keep").exists() and (jobs / "linked-job").is_symlink()
    assert sweep(jobs, apps, 14, []) == ["running-job"]  # once it is no longer running
    assert expired(tmp_path / "absent", 14, []) == []
