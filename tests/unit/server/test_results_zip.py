"""The download zip holds a job's plain files; links the job left are named, never followed."""

from __future__ import annotations

import os
import zipfile

from atoll.server.results_zip import SKIPPED, write_results_zip

SECRET = b"-----BEGIN PRIVATE KEY----- the server's"


def _job_folder(tmp_path):
    (tmp_path / "server.key").write_bytes(SECRET)
    folder = tmp_path / "jobs" / "j1"
    run = folder / "run" / "server"
    (run / "results" / "plots").mkdir(parents=True)
    (run / "logs").mkdir()
    (folder / "logs").mkdir()
    (run / "results" / "model.bin").write_bytes(b"\0" * (2 << 20))  # stored, not deflated
    (run / "results" / "plots" / "curve.png").write_bytes(b"png")
    (run / "logs" / "worker.log").write_text("server worker\n")
    (folder / "logs" / "site-1.log").write_text("site-1 tail\n")
    return folder, run


def test_plain_files_are_zipped_with_the_job_summary(tmp_path):
    folder, _ = _job_folder(tmp_path)
    out = write_results_zip(folder, tmp_path / "out.zip", {"job_id": "j1"})
    with zipfile.ZipFile(out) as archive:
        assert sorted(archive.namelist()) == [
            "job.json", "logs/server/worker.log", "logs/site-1.log", "results/model.bin",
            "results/plots/curve.png"]
        assert archive.getinfo("results/model.bin").compress_type == zipfile.ZIP_STORED
        assert archive.read("logs/site-1.log") == b"site-1 tail\n"


def test_links_the_job_planted_are_skipped_with_a_note(tmp_path):
    folder, run = _job_folder(tmp_path)
    (run / "results" / "server.key").symlink_to(tmp_path / "server.key")
    (run / "results" / "environ").symlink_to(f"/proc/{os.getpid()}/environ")
    (run / "results" / "root").symlink_to("/")
    os.link(tmp_path / "server.key", run / "results" / "hard.key")
    (run / "logs" / "worker.log").unlink()
    (run / "logs" / "worker.log").symlink_to(tmp_path / "server.key")
    out = write_results_zip(folder, tmp_path / "out.zip", {})
    with zipfile.ZipFile(out) as archive:
        assert SKIPPED in archive.namelist()
        for name in archive.namelist():
            assert SECRET not in archive.read(name), name
        note = archive.read(SKIPPED).decode()
    for name in ("results/server.key", "results/environ", "results/root", "results/hard.key",
                 "logs/worker.log"):
        assert f"run/server/{name}" in note, note


def test_a_results_folder_that_is_a_link_is_left_out(tmp_path):
    folder, run = _job_folder(tmp_path)
    (run / "results" / "model.bin").unlink()
    (run / "results" / "plots" / "curve.png").unlink()
    (run / "results" / "plots").rmdir()
    (run / "results").rmdir()
    (run / "results").symlink_to(tmp_path)  # would hold server.key
    out = write_results_zip(folder, tmp_path / "out.zip", {})
    with zipfile.ZipFile(out) as archive:
        assert not [n for n in archive.namelist() if n.startswith("results/")]
        assert "run/server/results in the job's run folder is a symbolic link" in \
            archive.read(SKIPPED).decode()
