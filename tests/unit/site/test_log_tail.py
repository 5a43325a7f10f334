"""The site parent ships the end of a worker's log, read as the job's file, for every launcher."""

from __future__ import annotations

import os
from pathlib import Path

from atoll.launchers.base import Handle
from atoll.site.supervisor import LOG_TAIL, SiteJob, Supervisor
from atoll.spec.resources import resolve_resources

SECRET = "PARENT_SECRET=not-for-the-server"


def _job(tmp_path: Path, handle: Handle | None = None) -> SiteJob:
    workdir = tmp_path / "jobs" / "j1"
    (workdir / "logs").mkdir(parents=True)
    job = SiteJob("j1", "default", workdir, resolve_resources(None, "site-1"))
    job.handle = handle
    return job


def test_the_tail_of_the_process_workers_log(tmp_path):
    job = _job(tmp_path)
    (job.workdir / "logs" / "worker.log").write_bytes(b"x" * LOG_TAIL + b"the end\n")
    tail = Supervisor._tail(job)
    assert len(tail) == LOG_TAIL and tail.endswith("the end\n")


def test_the_log_a_slurm_handle_names_is_read(tmp_path):
    handle = Handle("slurm", "42", "j1")
    job = _job(tmp_path, handle)
    handle.extra["log_file"] = str(job.workdir / "logs" / "slurm-42.out")
    (job.workdir / "logs" / "slurm-42.out").write_text("from the compute node\n")
    assert Supervisor._tail(job) == "from the compute node\n"


def test_a_log_named_outside_the_run_folder_is_not_read(tmp_path):
    (tmp_path / "elsewhere.log").write_text(SECRET)
    job = _job(tmp_path, Handle("slurm", "42", "j1", {"log_file": str(tmp_path /
                                                                        "elsewhere.log")}))
    assert Supervisor._tail(job) == ""  # logs/worker.log instead, which there is not


def test_no_log_is_an_empty_tail(tmp_path):
    assert Supervisor._tail(_job(tmp_path)) == ""


def test_a_log_swapped_for_a_link_is_named_not_followed(tmp_path):
    (tmp_path / "parent.env").write_text(SECRET)
    job = _job(tmp_path)
    (job.workdir / "logs" / "worker.log").symlink_to(tmp_path / "parent.env")
    tail = Supervisor._tail(job)
    assert SECRET not in tail
    assert "logs/worker.log in the job's run folder is a symbolic link" in tail
    (job.workdir / "logs" / "worker.log").unlink()
    (job.workdir / "logs" / "worker.log").symlink_to(f"/proc/{os.getpid()}/environ")
    assert "symbolic link" in Supervisor._tail(job)


def test_a_logs_folder_swapped_for_a_link_is_not_followed(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "worker.log").write_text(SECRET)
    job = _job(tmp_path)
    (job.workdir / "logs").rmdir()
    (job.workdir / "logs").symlink_to(tmp_path / "outside")
    tail = Supervisor._tail(job)
    assert SECRET not in tail and "logs in the job's run folder is a symbolic link" in tail
