"""A Pod's checkpoint sent home (wire/checkpoint_home.py): the committed checkpoint and the
results so far travel whole and come back whole; the parent takes them as untrusted input
(bounded, no climbing names or links, nothing outside checkpoint/ and results/, the state file's
SHA-256 checked) and keeps the zip it held before whenever it refuses one."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from atoll.fl import checkpoint
from atoll.wire.checkpoint_home import (
    HELD,
    held_checkpoint,
    keep_checkpoint,
    unpack_checkpoint,
    zip_checkpoint,
)
from atoll.wire.frames import file_chunks
from atoll.wire.job_archive import IntakeError


def _pod(tmp_path: Path, round_: int = 2) -> Path:
    """A server worker's run folder in a Pod: a committed checkpoint and its results so far."""
    run = tmp_path / f"pod-{round_}"
    checkpoint.save(run / "checkpoint", round_, {"workflow": {"w": np.arange(5.0) * round_},
                                                 "context": {"active": ["site-1"]}})
    (run / "results" / "site_models").mkdir(parents=True)
    (run / "results" / "metrics.csv").write_text("".join(f"{r},site-1,0.5\n"
                                                         for r in range(1, round_ + 1)))
    (run / "results" / "site_models" / "m.bin").write_bytes(os.urandom(2 << 20))
    return run


def _job(tmp_path: Path) -> Path:
    folder = tmp_path / "jobs" / "job-1"
    folder.mkdir(parents=True)
    return folder


def test_a_checkpoint_goes_home_and_comes_back_to_a_new_run_folder(tmp_path):
    run, job = _pod(tmp_path), _job(tmp_path)
    (run / "results" / "stolen").symlink_to(tmp_path / "secret")  # a link is not sent
    (tmp_path / "secret").write_text("the parent's")
    got = keep_checkpoint(file_chunks(zip_checkpoint(run, tmp_path / "c.zip")), job)
    assert got["round"] == 2 and got["bytes"] == (job / HELD).stat().st_size
    assert sorted(p.name for p in job.iterdir()) == [HELD]  # nothing else left there

    fresh = tmp_path / "resumed"
    (fresh / "results").mkdir(parents=True)  # the worker made it, empty
    assert unpack_checkpoint(file_chunks(held_checkpoint(job)), fresh) == 2
    round_, state = checkpoint.load(fresh / "checkpoint")
    assert round_ == 2 and np.array_equal(state["workflow"]["w"], np.arange(5.0) * 2)
    for name in ("metrics.csv", "site_models/m.bin"):
        assert (fresh / "results" / name).read_bytes() == (run / "results" / name).read_bytes()
    assert not (fresh / "results" / "stolen").exists()


def test_a_later_checkpoint_replaces_the_one_held(tmp_path):
    job = _job(tmp_path)
    keep_checkpoint(file_chunks(zip_checkpoint(_pod(tmp_path, 2), tmp_path / "2.zip")), job)
    keep_checkpoint(file_chunks(zip_checkpoint(_pod(tmp_path, 3), tmp_path / "3.zip")), job)
    fresh = tmp_path / "resumed"
    fresh.mkdir()
    assert unpack_checkpoint(file_chunks(job / HELD), fresh) == 3
    assert held_checkpoint(tmp_path / "no-such-job") is None


def _rezip(source: Path, out: Path, change) -> Path:
    """``source`` with its entries passed through ``change(name, data) -> [(name, data)]``."""
    with zipfile.ZipFile(source) as z, zipfile.ZipFile(out, "w") as w:
        for info in z.infolist():
            for name, data in change(info.filename, z.read(info)):
                w.writestr(name, data)
    return out


def _and(extra_name, extra=b"x"):
    """Every entry, and one more, named ``extra_name``."""
    return lambda n, d: [(n, d)] + ([(extra_name, extra)] if n.endswith(".json") else [])


def _flip(name, data):
    if name.endswith(".safetensors"):
        data = data[:-1] + bytes([data[-1] ^ 1])
    return [(name, data)]


def _manifest_round(name, data):
    if name.endswith("checkpoint.json"):
        doc = json.loads(data)
        doc["round"] = 7
        data = json.dumps(doc).encode()
    return [(name, data)]


HOSTILE = {
    "a damaged state file": (_flip, "state of round 2 is damaged"),
    "a manifest naming another round": (_manifest_round, "checkpoint.json is damaged"),
    "a file outside its two folders": (_and("app/custom.py"), "outside checkpoint/ and results/"),
    "a climbing name": (_and("results/../../escaped"), "points outside"),
    "another file in checkpoint/": (_and("checkpoint/round-1.safetensors"), "nothing else"),
    "no manifest": (
        lambda n, d: [] if n.endswith(".json") else [(n, d)], "holds no checkpoint/"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_refused_checkpoint_leaves_the_one_held(tmp_path, case):
    change, reason = HOSTILE[case]
    job = _job(tmp_path)
    keep_checkpoint(file_chunks(zip_checkpoint(_pod(tmp_path, 1), tmp_path / "1.zip")), job)
    before = (job / HELD).read_bytes()
    hostile = _rezip(zip_checkpoint(_pod(tmp_path, 2), tmp_path / "2.zip"), tmp_path / "h.zip",
                     change)
    with pytest.raises(IntakeError, match=reason):
        keep_checkpoint(file_chunks(hostile), job)
    assert (job / HELD).read_bytes() == before
    assert sorted(p.name for p in job.iterdir()) == [HELD]
    assert not (tmp_path / "escaped").exists()


def test_a_link_entry_and_an_oversized_one_are_refused(tmp_path):
    job = _job(tmp_path)
    archive = zip_checkpoint(_pod(tmp_path), tmp_path / "c.zip")
    with pytest.raises(IntakeError, match="larger than the limit of 1000 bytes"):
        keep_checkpoint(file_chunks(archive), job, max_bytes=1000)
    linked = tmp_path / "l.zip"
    with zipfile.ZipFile(archive) as z, zipfile.ZipFile(linked, "w") as w:
        for info in z.infolist():
            w.writestr(info, z.read(info))
        link = zipfile.ZipInfo("results/key")
        link.external_attr = (0o120777 << 16)
        w.writestr(link, "/etc/shadow")
    with pytest.raises(IntakeError, match="symbolic link"):
        keep_checkpoint(file_chunks(linked), job)
    with pytest.raises(IntakeError, match="not a zip"):
        keep_checkpoint(iter([b"not a zip at all" * 100]), job)
    assert list(job.iterdir()) == []


def test_a_held_checkpoint_damaged_on_the_parent_fails_the_unpack_naming_it(tmp_path):
    job = _job(tmp_path)
    keep_checkpoint(file_chunks(zip_checkpoint(_pod(tmp_path), tmp_path / "c.zip")), job)
    data = bytearray((job / HELD).read_bytes())
    with zipfile.ZipFile(job / HELD) as z:
        [state] = [i for i in z.infolist() if i.filename.endswith(".safetensors")]
    data[state.header_offset + 100] ^= 0xFF  # inside the state file's bytes (stored as they are)
    (job / HELD).write_bytes(bytes(data))
    fresh = tmp_path / "resumed"
    fresh.mkdir()
    with pytest.raises(IntakeError, match="state of round 2 is damaged"):
        unpack_checkpoint(file_chunks(job / HELD), fresh)
    assert not (fresh / "checkpoint").exists()


def test_a_checkpoint_that_cannot_be_stored_is_refused_without_the_parents_paths(tmp_path):
    archive = zip_checkpoint(_pod(tmp_path), tmp_path / "c.zip")
    gone = tmp_path / "jobs" / "deleted-meanwhile"
    with pytest.raises(IntakeError, match="could not be kept: No such file") as refused:
        keep_checkpoint(file_chunks(archive), gone)
    assert str(tmp_path) not in str(refused.value)
