"""The handles a site parent keeps of its workers (site/running_parts.py): written at launch,
gone at the end; what a killed parent left is stopped by its successor (never a process worker,
whose pid may be another process's now), and a damaged entry is dropped, not trusted."""

from __future__ import annotations

import stat

from atoll.launchers.base import Handle
from atoll.site.running_parts import FOLDER, RunningParts

JOB, OTHER = "a" * 32, "b" * 32


class Recorder:
    """A launcher's cancel, recorded (the real backends' cancels: tests/integration)."""

    def __init__(self, name):
        self.name, self.cancelled = name, []

    def cancel(self, handle):
        self.cancelled.append(handle.native_id)


def test_a_kept_handle_is_stopped_by_the_next_parent_once(tmp_path):
    parts = RunningParts(tmp_path)
    parts.launched(Handle("docker", "c0ffee", JOB, {"container": "atoll-x"}))
    parts.launched(Handle("docker", "f00d", OTHER))
    parts.ended(OTHER)  # ended normally: nothing left of it
    path = tmp_path / FOLDER / f"{JOB}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = RunningParts(tmp_path)  # the restarted parent
    assert [h.extra for h in again.left_behind()] == [{"container": "atoll-x"}]
    docker = Recorder("docker")
    assert again.stop_left_behind(docker) == [JOB] and docker.cancelled == ["c0ffee"]
    assert again.left_behind() == [] and not path.exists()


def test_process_workers_and_damaged_entries_are_only_forgotten(tmp_path):
    parts = RunningParts(tmp_path)
    parts.launched(Handle("process", "4242", JOB))
    (tmp_path / FOLDER / "junk.json").write_text('{"job_id": "../../etc"}')
    process = Recorder("process")
    assert parts.stop_left_behind(process) == [] and process.cancelled == []
    assert list((tmp_path / FOLDER).iterdir()) == []


def test_what_taking_a_worker_back_needs_is_kept_privately_and_read_back(tmp_path):
    from atoll.site.running_parts import Rejoin

    parts = RunningParts(tmp_path)
    rejoin = Rejoin("the-token", "10.0.0.5:7101#abc", "study-1", {"num_of_gpus": 1},
                    {"signer": {"name": "alice"}})
    parts.launched(Handle("slurm", "1234", JOB, {"log_file": "x"}), rejoin)
    parts.launched(Handle("slurm", "1235", OTHER))  # launched without re-attach
    folder = tmp_path / FOLDER
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # the token is a secret
    assert stat.S_IMODE((folder / f"{JOB}.json").stat().st_mode) == 0o600
    kept = dict((h.job_id, r) for h, r in RunningParts(tmp_path).kept())
    assert kept == {JOB: rejoin, OTHER: None}


def test_an_entry_under_another_jobs_name_is_dropped(tmp_path):
    import json

    parts = RunningParts(tmp_path)
    parts.launched(Handle("docker", "c0ffee", JOB))
    doc = json.loads((tmp_path / FOLDER / f"{JOB}.json").read_text())
    (tmp_path / FOLDER / f"{OTHER}.json").write_text(json.dumps(doc))  # a copy, renamed
    assert [h.job_id for h, _ in parts.kept()] == [JOB]
    assert not (tmp_path / FOLDER / f"{OTHER}.json").exists()
