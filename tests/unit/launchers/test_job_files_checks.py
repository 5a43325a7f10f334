"""Checks of launchers/job_files.py that tests/unit/launchers/test_job_files.py does not reach.

create_job_file against a job that plants its link again between the parent's unlink and its
open, as a symbolic or a hard link to a file of the parent's: the open (O_CREAT|O_EXCL|O_NOFOLLOW)
refuses the name instead of writing through it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atoll.launchers import job_files
from atoll.launchers.job_files import JobFileError, create_job_file, open_job_file

SECRET = b"PARENT_SECRET=do-not-ship-me\n"


@pytest.mark.parametrize("planted", ["symlink", "hardlink"])
def test_a_name_planted_again_after_the_unlink_is_refused(tmp_path: Path, monkeypatch,
                                                           planted: str) -> None:
    target = tmp_path / "parent-only.key"
    target.write_bytes(SECRET)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    log = run / "logs" / "site-1.log"
    log.symlink_to(target)
    real_unlink = os.unlink

    def unlink_then_replant(name, *, dir_fd=None):  # the job wins the race
        real_unlink(name, dir_fd=dir_fd)
        if planted == "symlink":
            log.symlink_to(target)
        else:  # a hard link to the parent's file: O_NOFOLLOW alone would open it
            os.link(target, log)

    monkeypatch.setattr(job_files.os, "unlink", unlink_then_replant)
    with pytest.raises(JobFileError, match="logs/site-1.log in the job's run folder"):
        with create_job_file(run, "logs/site-1.log") as out:
            out.write(b"tail")
    monkeypatch.undo()
    assert target.read_bytes() == SECRET  # never written through the link


def test_a_file_over_the_limit_is_refused_at_open_before_a_byte_is_read(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"x" * 101)
    with pytest.raises(JobFileError, match="model.bin in the job's run folder is larger than the "
                                           "limit of 100 bytes"):
        open_job_file(tmp_path, "model.bin", max_bytes=100)
    with open_job_file(tmp_path, "model.bin", max_bytes=101) as handle:
        assert handle.read() == b"x" * 101
