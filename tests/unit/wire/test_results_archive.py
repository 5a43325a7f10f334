"""A worker's results sent home (wire/results_archive.py): plain files only from the worker, and
the parent takes them as untrusted input: bounded, no climbing names, no links, its own files
kept."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from atoll.wire.frames import file_chunks
from atoll.wire.job_archive import IntakeError
from atoll.wire.results_archive import SKIPPED, unpack_results, zip_results


def _results(tmp_path: Path) -> Path:
    folder = tmp_path / "pod" / "results"
    (folder / "models").mkdir(parents=True)
    (folder / "metrics.csv").write_text("round,loss\n1,0.5\n")
    (folder / "models" / "global_model_final.safetensors").write_bytes(os.urandom(3 << 20))
    return folder


def test_results_travel_whole_and_land_in_the_run_folder(tmp_path):
    folder = _results(tmp_path)
    archive = zip_results(folder, tmp_path / "r.zip")
    run = tmp_path / "run"
    got = unpack_results(file_chunks(archive), run)
    assert got["files"] == 2
    for name in ("metrics.csv", "models/global_model_final.safetensors"):
        assert (run / "results" / name).read_bytes() == (folder / name).read_bytes()
    assert not list((run / "tmp").iterdir())  # the scratch upload is gone


def test_the_worker_sends_no_link_and_says_what_it_left_out(tmp_path):
    folder = _results(tmp_path)
    secret = tmp_path / "secret.key"
    secret.write_text("the pod's token")
    (folder / "stolen").symlink_to(secret)
    (folder / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    archive = zip_results(folder, tmp_path / "r.zip")
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        assert "stolen" not in names and not any(n.startswith("linked-dir") for n in names)
        assert "stolen" in z.read(SKIPPED).decode() and "linked-dir" in z.read(SKIPPED).decode()


@pytest.mark.parametrize("name", ["../escaped.txt", "/etc/cron.d/x", "a/../../escaped.txt"])
def test_a_name_that_leaves_the_folder_is_refused_and_nothing_kept(tmp_path, name):
    archive = tmp_path / "hostile.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("fine.txt", "ok")
        z.writestr(name, "climbed out")
    run = tmp_path / "deep" / "run"
    with pytest.raises(IntakeError):
        unpack_results(file_chunks(archive), run)
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not (run / "escaped.txt").exists()
    assert not (run / "results" / "fine.txt").exists()


def test_a_link_inside_the_zip_is_refused(tmp_path):
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as z:
        info = zipfile.ZipInfo("evil")
        info.external_attr = (0o120777 << 16)  # a symbolic link entry
        z.writestr(info, "/etc/passwd")
    with pytest.raises(IntakeError):
        unpack_results(file_chunks(archive), tmp_path / "run")
    assert not (tmp_path / "run" / "results" / "evil").is_symlink()


def test_results_over_the_bound_are_refused(tmp_path):
    archive = zip_results(_results(tmp_path), tmp_path / "r.zip")
    with pytest.raises(IntakeError):
        unpack_results(file_chunks(archive), tmp_path / "run", max_bytes=1 << 20)
    assert not list((tmp_path / "run" / "results").iterdir())


def test_the_parents_own_files_are_not_replaced(tmp_path):
    archive = zip_results(_results(tmp_path), tmp_path / "r.zip")
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "results" / "metrics.csv").write_text("the parent's own\n")
    got = unpack_results(file_chunks(archive), run)
    assert (run / "results" / "metrics.csv").read_text() == "the parent's own\n"
    assert got["files"] == 1


def test_a_results_folder_that_is_a_link_is_not_written_through(tmp_path):
    archive = zip_results(_results(tmp_path), tmp_path / "r.zip")
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "results").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(IntakeError):
        unpack_results(file_chunks(archive), run)
    assert not list(elsewhere.iterdir())
