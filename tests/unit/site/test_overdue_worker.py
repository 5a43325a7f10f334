"""A worker that outlives its workflow's end is cancelled after END_GRACE_S, and its job fails
with that reason (site/supervisor.py ``end``). The grace timer is replaced by one the test fires
itself: nothing here waits on a clock."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from atoll.launchers.base import Handle, Outcome, WorkerExit
from atoll.parent.worker_endpoint import WorkerTokens
from atoll.site import supervisor as supervisor_module
from atoll.site.supervisor import END_GRACE_S, SiteJob, Supervisor

JOB_ID = "e" * 32


class Timers:
    """Stands in for threading.Timer: records each timer armed; the test fires it."""

    def __init__(self):
        self.armed = []

    def __call__(self, interval, function):
        timer = SimpleNamespace(interval=interval, function=function, daemon=False,
                                started=False)
        timer.start = lambda: setattr(timer, "started", True)
        self.armed.append(timer)
        return timer


class Launcher:
    name = "process"

    def __init__(self):
        self.cancelled = []

    def cancel(self, handle):
        self.cancelled.append(handle)


class Link:
    def __init__(self):
        self.states = []

    def send_state(self, job_id, state, reason="", **extra):
        self.states.append((job_id, state, reason))


@pytest.fixture
def timers(monkeypatch):
    timers = Timers()
    # only the supervisor's name for the module is replaced, not threading itself
    monkeypatch.setattr(supervisor_module, "threading",
                        SimpleNamespace(Timer=timers, Thread=threading.Thread,
                                        Lock=threading.Lock, Event=threading.Event))
    return timers


@pytest.fixture
def supervisor(tmp_path):
    kit = SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws")
    host = SimpleNamespace(launcher=Launcher(), runs_root=lambda: tmp_path / "ws")
    return Supervisor(kit, host=host, link=Link(), server=None, tokens=WorkerTokens())


def running(supervisor, tmp_path: Path) -> SiteJob:
    job = SiteJob(JOB_ID, "pathology", tmp_path / "ws" / "jobs" / JOB_ID, resources=None,
                  handle=Handle("process", "4242", JOB_ID))
    supervisor.jobs[JOB_ID] = job
    return job


def test_a_worker_still_running_after_the_grace_is_cancelled_and_its_job_fails(
        supervisor, timers, tmp_path):
    job = running(supervisor, tmp_path)
    supervisor.end(JOB_ID)
    assert job.ended.is_set()
    [timer] = timers.armed
    assert (timer.interval, timer.daemon, timer.started) == (END_GRACE_S, True, True)
    assert supervisor.host.launcher.cancelled == []  # nothing before the grace is over

    timer.function()  # the grace is over and the worker has not exited
    assert supervisor.host.launcher.cancelled == [job.handle]
    why = f"did not exit within {END_GRACE_S:.0f} s of the workflow's end"
    assert job.report == (False, why)

    # the launcher then reports the worker's exit: the job failed, and says why
    supervisor._finish(job, WorkerExit(Outcome.COMPLETED, ""))
    assert supervisor.link.states == [(JOB_ID, "FINISHED:FAILED", why)]
    assert supervisor.running_jobs() == []


def test_a_worker_that_exited_within_the_grace_is_left_alone(supervisor, timers, tmp_path):
    job = running(supervisor, tmp_path)
    supervisor.end(JOB_ID)
    supervisor._finish(job, WorkerExit(Outcome.COMPLETED, ""))
    [timer] = timers.armed
    timer.function()
    assert supervisor.host.launcher.cancelled == []
    assert supervisor.link.states == [(JOB_ID, "FINISHED:COMPLETED", "")]


def test_a_new_job_under_the_same_id_is_not_cancelled_by_the_old_timer(
        supervisor, timers, tmp_path):
    old = running(supervisor, tmp_path)
    supervisor.end(JOB_ID)
    supervisor._forget(JOB_ID, old)
    new = running(supervisor, tmp_path)
    timers.armed[0].function()
    assert supervisor.host.launcher.cancelled == [] and new.report is None


@pytest.mark.parametrize("job_id", ["f" * 32, "../x"])
def test_an_end_for_no_job_here_arms_nothing(supervisor, timers, tmp_path, job_id):
    running(supervisor, tmp_path)
    supervisor.end(job_id)
    assert timers.armed == [] and not supervisor.jobs[JOB_ID].ended.is_set()
