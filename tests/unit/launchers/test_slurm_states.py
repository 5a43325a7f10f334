"""Slurm states -> atoll outcomes, squeue/sacct parsing, and the poller's decisions (no Slurm)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from atoll.launchers.base import Outcome
from atoll.launchers.slurm_poller import LOST_AFTER_ROUNDS, SlurmPoller, Watched
from atoll.launchers.slurm_states import (
    FINAL_STATES,
    LIVE_STATES,
    JobState,
    decode_wait_status,
    final_exit,
    first_failed_task,
    parse_sacct,
    parse_squeue,
    progress_note,
)

# Recorded from the project's Slurm 22.05 (scripts/backends/slurm.sh) with
# squeue -h --states=all --jobs=... -O 'JobID:|,State:|,Reason:|,NodeList:|,exit_code:|'
SQUEUE_SAMPLE = """\
5|OUT_OF_MEMORY|OutOfMemory|n1|253|
6|CANCELLED|Priority||0|
14|TIMEOUT|TimeLimit|n2|15|
15|COMPLETED|None|n[1-2]|0|
16|FAILED|NonZeroExitCode|n1|768|
17|PENDING|Resources||0|
"""
SACCT_SAMPLE = "5|OUT_OF_MEMORY|0:125\n6|CANCELLED by 0|0:0\n16|FAILED|3:0\n18|RUNNING|0:0\n"


def test_parse_squeue() -> None:
    jobs = parse_squeue(SQUEUE_SAMPLE + "garbage line\n")
    assert set(jobs) == {"5", "6", "14", "15", "16", "17"}
    assert jobs["16"] == JobState("16", "FAILED", "NonZeroExitCode", "n1", 3)
    assert jobs["14"].exit_code == -15  # SIGTERM at the time limit
    assert jobs["17"].waiting and not jobs["17"].final
    assert jobs["15"].nodes == "n[1-2]"


def test_parse_sacct() -> None:
    jobs = parse_sacct(SACCT_SAMPLE)
    assert jobs["6"].state == "CANCELLED"
    assert jobs["16"].exit_code == 3 and jobs["5"].exit_code == -125
    assert not jobs["18"].final


@pytest.mark.parametrize(("raw", "code"), [(0, 0), (768, 3), (15, -15), (9, -9), (256, 1)])
def test_decode_wait_status(raw: int, code: int) -> None:
    assert decode_wait_status(raw) == code


def test_every_final_state_has_an_outcome_and_no_state_is_both() -> None:
    assert not set(FINAL_STATES) & LIVE_STATES
    expected = {
        "COMPLETED": Outcome.COMPLETED,
        "FAILED": Outcome.FAILED,
        "OUT_OF_MEMORY": Outcome.FAILED,
        "TIMEOUT": Outcome.FAILED,
        "NODE_FAIL": Outcome.FAILED,
        "BOOT_FAIL": Outcome.FAILED,
        "DEADLINE": Outcome.FAILED,
        "SPECIAL_EXIT": Outcome.FAILED,
        "CANCELLED": Outcome.ABORTED,
        "PREEMPTED": Outcome.ABORTED,
        "REVOKED": Outcome.ABORTED,
    }
    assert {state: outcome for state, (outcome, _) in FINAL_STATES.items()} == expected


def test_final_exit_reasons() -> None:
    oom = final_exit(JobState("5", "OUT_OF_MEMORY", exit_code=-125), mem="64M")
    assert oom.outcome is Outcome.FAILED
    assert oom.reason.startswith("Slurm job 5: OUT_OF_MEMORY: out of memory (limit --mem=64M)")
    timeout = final_exit(JobState("14", "TIMEOUT"), time="1")
    assert "TIMEOUT: over its time limit (--time=1)" in timeout.reason
    failed = final_exit(JobState("16", "FAILED", exit_code=3), log="/w/logs/slurm-16.out")
    assert failed.reason == "Slurm job 16: worker exited with code 3; see /w/logs/slurm-16.out"
    assert failed.exit_code == 3
    ok = final_exit(JobState("15", "COMPLETED", exit_code=0))
    assert ok.outcome is Outcome.COMPLETED
    ours = final_exit(JobState("6", "CANCELLED"), cancelled_by_atoll=True)
    assert (ours.outcome, ours.reason) == (Outcome.ABORTED, "cancelled (scancel of Slurm job 6)")
    theirs = final_exit(JobState("6", "CANCELLED"))
    assert theirs.outcome is Outcome.ABORTED and "outside atoll" in theirs.reason


def test_progress_notes() -> None:
    assert progress_note(JobState("1", "PENDING", "Resources")) == "pending: Resources"
    assert progress_note(JobState("1", "RUNNING", "None", "n1")) == "running on n1"
    assert progress_note(JobState("1", "COMPLETING")) == "completing"


# --- the poller's decisions, one round at a time (poll_once: no thread, no sleeping) ----------


class FakeSlurm:
    """Answers the poller's query from a dict the test edits; records cancels."""

    def __init__(self) -> None:
        self.states: dict[str, JobState] = {}
        self.cancelled: list[str] = []
        self.fail: Exception | None = None
        self.now = 0.0

    def query(self, ids: list[str]) -> dict[str, JobState]:
        if self.fail is not None:
            raise self.fail
        return {i: self.states[i] for i in ids if i in self.states}

    def cancel(self, native_id: str) -> None:
        self.cancelled.append(native_id)


def poller_with(slurm: FakeSlurm) -> SlurmPoller:
    return SlurmPoller(slurm.query, slurm.cancel, clock=lambda: slurm.now)


def watched(native_id: str = "7", **fields: Any) -> Watched:
    return Watched(native_id=native_id, submitted=0.001, **fields)


def test_poller_reports_progress_then_the_final_state() -> None:
    slurm, notes = FakeSlurm(), []
    poller, job = poller_with(slurm), watched(on_progress=notes.append, mem="256M")
    slurm.states["7"] = JobState("7", "PENDING", "Priority")
    assert poller.poll_once([job]) is True
    assert poller.poll_once([job]) is False  # nothing new: the back-off grows
    slurm.states["7"] = JobState("7", "RUNNING", "None", "n2")
    poller.poll_once([job])
    slurm.states["7"] = JobState("7", "OUT_OF_MEMORY", "OutOfMemory", "n2", -125)
    poller.poll_once([job])
    assert notes == ["pending: Priority", "running on n2"]
    assert job.done.is_set() and job.result is not None
    assert job.result.outcome is Outcome.FAILED and "OUT_OF_MEMORY" in job.result.reason


def test_unknown_state_is_not_finished() -> None:
    slurm = FakeSlurm()
    poller, job = poller_with(slurm), watched()
    slurm.states["7"] = JobState("7", "SOME_FUTURE_STATE")
    poller.poll_once([job])
    assert not job.done.is_set() and job.result is None


def test_failed_poll_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    slurm = FakeSlurm()
    poller, job = poller_with(slurm), watched()
    slurm.fail = RuntimeError("Unable to contact slurm controller")
    with caplog.at_level(logging.WARNING):
        assert poller.poll_once([job]) is False
    assert "Unable to contact slurm controller" in caplog.text
    assert job.result is None


def test_pending_past_timeout_is_cancelled_with_that_reason() -> None:
    slurm = FakeSlurm()
    poller, job = poller_with(slurm), watched(pending_timeout=30)
    slurm.states["7"] = JobState("7", "PENDING", "Resources")
    slurm.now = 10
    poller.poll_once([job])
    assert slurm.cancelled == []
    slurm.now = 31
    poller.poll_once([job])
    assert slurm.cancelled == ["7"]
    slurm.states["7"] = JobState("7", "CANCELLED", "Resources")
    poller.poll_once([job])
    assert job.result is not None and job.result.outcome is Outcome.FAILED
    assert "pending_timeout of 30 s" in job.result.reason
    assert "Slurm's reason: Resources" in job.result.reason


def test_running_job_is_not_cancelled_by_pending_timeout() -> None:
    slurm = FakeSlurm()
    poller, job = poller_with(slurm), watched(pending_timeout=5)
    slurm.states["7"] = JobState("7", "RUNNING", "None", "n1")
    slurm.now = 100
    poller.poll_once([job])
    assert slurm.cancelled == [] and job.result is None


def test_cancel_by_atoll_is_aborted() -> None:
    slurm = FakeSlurm()
    poller, job = poller_with(slurm), watched()
    job.cancelled = True
    slurm.states["7"] = JobState("7", "CANCELLED", "None", "n1", -15)
    poller.poll_once([job])
    assert job.result is not None and job.result.outcome is Outcome.ABORTED


def test_job_slurm_forgot_fails_after_some_rounds_and_cleans_up() -> None:
    slurm, cleaned = FakeSlurm(), []
    poller = poller_with(slurm)
    job = watched(on_final=lambda: cleaned.append(True))
    for _ in range(LOST_AFTER_ROUNDS - 1):
        poller.poll_once([job])
    assert job.result is None
    poller.poll_once([job])
    assert job.result is not None and job.result.outcome is Outcome.FAILED
    assert "no longer knows job 7" in job.result.reason
    assert cleaned == [True]


def test_a_broken_progress_callback_does_not_stop_watching() -> None:
    def boom(_: str) -> None:
        raise ValueError("callback bug")

    slurm = FakeSlurm()
    poller, job = poller_with(slurm), watched(on_progress=boom)
    slurm.states["7"] = JobState("7", "RUNNING", "None", "n1")
    poller.poll_once([job])
    slurm.states["7"] = JobState("7", "COMPLETED", "None", "n1", 0)
    poller.poll_once([job])
    assert job.result is not None and job.result.outcome is Outcome.COMPLETED


def test_close_releases_waiters_and_refuses_new_jobs() -> None:
    slurm = FakeSlurm()
    slurm.states["7"] = JobState("7", "PENDING", "Priority")
    poller = poller_with(slurm)
    job = poller.watch(watched())
    poller.close()
    assert job.done.is_set() and job.result is not None
    assert job.result.outcome is Outcome.ABORTED and "stopped watching" in job.result.reason
    with pytest.raises(RuntimeError, match="closed"):
        poller.watch(watched("8"))


# --- which rank of a multi-task job failed first (srun's own lines in the job's log) -----------


SRUN_LOG = """0: atoll worker: job 1234 role site registered with 127.0.0.1:33451
1: Traceback (most recent call last):
1: RuntimeError: srun: error: n9: task 7: forged by the script, on a labelled line
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=3.0
srun: error: n1: task 0: Terminated
"""


def test_the_first_failed_task_is_read_from_sruns_lines() -> None:
    assert first_failed_task(SRUN_LOG) == ("1", "n2", "Killed")
    assert first_failed_task("srun: error: n1: tasks 0-1: Exited with exit code 1\n") == (
        "0-1", "n1", "Exited with exit code 1")


def test_a_log_without_srun_errors_names_no_task() -> None:
    assert first_failed_task("") is None
    assert first_failed_task("0: srun: error: n2: task 1: Killed\n") is None  # a rank's own line
