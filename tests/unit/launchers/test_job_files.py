"""A parent reads a job's files only as regular files inside its run folder, never via a link."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from atoll.launchers.job_files import (
    JobFileError,
    create_job_file,
    iter_job_files,
    open_job_file,
    read_job_file,
    read_tail,
)

SECRET = b"PARENT_SECRET=do-not-ship-me\n"


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    """A run folder with logs/, next to a file of the parent's the job must never get."""
    (tmp_path / "parent-only.key").write_bytes(SECRET)
    folder = tmp_path / "run"
    (folder / "logs").mkdir(parents=True)
    return folder


def test_a_regular_file_is_read(run: Path) -> None:
    (run / "logs" / "worker.log").write_bytes(b"line 1\nline 2\n")
    assert read_job_file(run, "logs/worker.log") == b"line 1\nline 2\n"
    assert read_tail(run, Path("logs") / "worker.log", 7) == b"line 2\n"
    with open_job_file(run, "./logs/worker.log") as handle:
        assert handle.read() == b"line 1\nline 2\n"


def test_a_missing_file_is_file_not_found(run: Path) -> None:
    with pytest.raises(FileNotFoundError, match="logs/none.log does not exist"):
        read_tail(run, "logs/none.log", 100)
    with pytest.raises(FileNotFoundError):
        read_job_file(run, "nofolder/x")


def test_a_symlink_as_the_file_is_refused(run: Path) -> None:
    (run / "logs" / "worker.log").symlink_to(run.parent / "parent-only.key")
    with pytest.raises(JobFileError, match="logs/worker.log .* symbolic link") as caught:
        read_tail(run, "logs/worker.log", 1000)
    assert isinstance(caught.value, OSError) and caught.value.rel == "logs/worker.log"
    assert SECRET.decode() not in str(caught.value)


def test_a_symlink_to_proc_is_refused(run: Path) -> None:
    """The attack seen: the log swapped for a link to the parent's own environment."""
    (run / "logs" / "worker.log").symlink_to(f"/proc/{os.getpid()}/environ")
    with pytest.raises(JobFileError, match="symbolic link"):
        read_tail(run, "logs/worker.log", 64 * 1024)


def test_a_symlinked_folder_on_the_way_is_refused(run: Path) -> None:
    (run / "logs").rmdir()
    (run / "logs").symlink_to(run.parent)  # logs/parent-only.key is now the parent's key
    with pytest.raises(JobFileError, match="^logs in .* is a symbolic link"):
        read_job_file(run, "logs/parent-only.key")
    (run / "deep").mkdir()
    (run / "deep" / "up").symlink_to("/")
    with pytest.raises(JobFileError, match="^deep/up in .* is a symbolic link"):
        read_job_file(run, "deep/up/etc/hostname")


def test_dot_dot_and_absolute_paths_are_refused(run: Path) -> None:
    for rel in ("../parent-only.key", "logs/../../parent-only.key", "/etc/hostname", "", "."):
        with pytest.raises(JobFileError, match="not a plain path"):
            read_job_file(run, rel)


def test_a_fifo_is_refused_without_blocking(run: Path) -> None:
    os.mkfifo(run / "logs" / "worker.log")
    result: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(result, run, "logs/worker.log"), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "opening a FIFO blocked the parent"
    assert isinstance(result[0], JobFileError) and "not a regular file" in str(result[0])


def _catch(out: list[BaseException], run: Path, rel: str) -> None:
    try:
        read_tail(run, rel, 100)
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        out.append(exc)


def test_a_device_is_refused(run: Path) -> None:
    # /dev itself as the "run folder": null is a character device reached without a link.
    with pytest.raises(JobFileError, match="not a regular file"):
        read_job_file(Path("/dev"), "null")
    if os.geteuid() == 0:  # only root may make a device node inside the run folder
        os.mknod(run / "logs" / "worker.log", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        with pytest.raises(JobFileError, match="not a regular file"):
            read_tail(run, "logs/worker.log", 100)


def test_a_folder_in_place_of_the_file_is_refused(run: Path) -> None:
    (run / "logs" / "worker.log").mkdir()
    with pytest.raises(JobFileError, match="not a regular file"):
        read_tail(run, "logs/worker.log", 100)


def test_a_hard_link_to_a_file_outside_is_refused(run: Path) -> None:
    os.link(run.parent / "parent-only.key", run / "logs" / "worker.log")
    with pytest.raises(JobFileError, match="2 hard links"):
        read_tail(run, "logs/worker.log", 100)


def test_a_file_over_the_limit_is_refused_not_cut(run: Path) -> None:
    (run / "result.json").write_bytes(b"x" * 101)
    with pytest.raises(JobFileError, match="larger than the limit of 100 bytes"):
        read_job_file(run, "result.json", max_bytes=100)
    assert read_job_file(run, "result.json", max_bytes=101) == b"x" * 101
    # A tail has no such limit: it reads only the end of a log of any size.
    assert read_tail(run, "result.json", 3) == b"xxx"


def test_iter_job_files_reads_plain_files_and_skips_the_rest(run: Path) -> None:
    results = run / "results"
    (results / "sub").mkdir(parents=True)
    (results / "model.bin").write_bytes(b"weights")
    (results / "sub" / "metrics.json").write_bytes(b"{}")
    (results / "key.pem").symlink_to(run.parent / "parent-only.key")
    (results / "root").symlink_to("/")
    os.link(run.parent / "parent-only.key", results / "hard.pem")
    os.mkfifo(results / "pipe")
    skipped: list[str] = []
    got = {name: handle.read() for name, handle in iter_job_files(run, "results", skipped)}
    assert got == {"model.bin": b"weights", "sub/metrics.json": b"{}"}
    assert SECRET not in b"".join(got.values())
    notes = "\n".join(skipped)
    for name in ("key.pem", "root", "hard.pem", "pipe"):
        assert f"results/{name}" in notes
    assert list(iter_job_files(run, "no-such-folder", skipped)) == []


def test_iter_job_files_refuses_a_symlinked_top_folder(run: Path) -> None:
    (run / "results").symlink_to(run.parent)
    with pytest.raises(JobFileError, match="^results in .* is a symbolic link"):
        list(iter_job_files(run, "results", []))


def test_create_job_file_replaces_a_planted_link_and_is_private(run: Path) -> None:
    target = run.parent / "parent-only.key"
    (run / "logs" / "site-1.log").symlink_to(target)
    old = os.umask(0)
    try:
        with create_job_file(run, "logs/site-1.log") as out:
            out.write(b"tail")
    finally:
        os.umask(old)
    assert target.read_bytes() == SECRET  # the link's target was not written through
    written = run / "logs" / "site-1.log"
    assert not written.is_symlink() and written.read_bytes() == b"tail"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600


def test_create_job_file_refuses_a_symlinked_folder(run: Path) -> None:
    (run / "logs").rmdir()
    (run / "logs").symlink_to(run.parent)
    with pytest.raises(JobFileError, match="symbolic link"):
        create_job_file(run, "logs/parent-only.key")
    assert (run.parent / "parent-only.key").read_bytes() == SECRET
