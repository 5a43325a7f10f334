"""One thread per Slurm launcher that watches all of its live jobs with one batched query.

Each round asks Slurm about every live job at once (``query(ids)``: squeue, then sacct for jobs
squeue no longer lists) and then sleeps along ``BACKOFF_S``: 0.2 s after anything changed (a new
job, a state or reason change, a cancel), then 0.2, 0.5, 0.5, 1, 1, 2, 2 and at most 5 s while
nothing does (a job's first ~10 s, when most refusals and crashes happen, are watched closely). A failed query is logged, never raised: the jobs keep their last known state and the next
round tries again. A job no query knows any more for ``LOST_AFTER_ROUNDS`` rounds in a row is
reported FAILED (Slurm lost it, e.g. state cleared by an admin).

A job still waiting (PENDING...) ``pending_timeout`` seconds after its submission is cancelled
with ``scancel`` and ends FAILED with that reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from atoll.launchers.base import Outcome, ProgressCallback, WorkerExit
from atoll.launchers.slurm_states import JobState, final_exit, progress_note

log = logging.getLogger(__name__)

BACKOFF_S = (0.2, 0.2, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0, 5.0)
LOST_AFTER_ROUNDS = 5

Query = Callable[[list[str]], dict[str, JobState]]  # native ids -> what Slurm knows; may raise
Cancel = Callable[[str], None]  # scancel one job; may raise


@dataclass
class Watched:
    """A job the poller follows until Slurm reports it finished."""

    native_id: str
    pending_timeout: float | None = None
    on_progress: ProgressCallback | None = None
    on_final: Callable[[], None] | None = None  # cleanup once finished (e.g. the secrets file)
    mem: str | None = None
    time_limit: str | None = None
    log_file: str = "the job's logs"
    submitted: float = 0.0
    cancelled: bool = False  # by atoll's cancel()
    forced: WorkerExit | None = None  # why atoll cancelled it itself (pending_timeout)
    note: str = ""
    state: str = ""
    unknown_rounds: int = 0
    result: WorkerExit | None = None
    done: threading.Event = field(default_factory=threading.Event)


class SlurmPoller:
    def __init__(
        self,
        query: Query,
        cancel: Cancel,
        *,
        backoff: tuple[float, ...] = BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._query, self._cancel = query, cancel
        self._backoff, self._clock = backoff, clock
        self._jobs: dict[str, Watched] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # ----- called by the launcher -----------------------------------------------------------

    def watch(self, job: Watched) -> Watched:
        """Follow ``job`` (the first watch of an id wins); starts the thread on first use."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the Slurm poller is closed")
            existing = self._jobs.get(job.native_id)
            if existing is not None:
                return existing
            job.submitted = job.submitted or self._clock()
            self._jobs[job.native_id] = job
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="atoll-slurm-poller", daemon=True
                )
                self._thread.start()
        self.poke()
        return job

    def get(self, native_id: str) -> Watched | None:
        with self._lock:
            return self._jobs.get(native_id)

    def poke(self) -> None:
        """Poll now (a new job, a cancel) and restart the back-off."""
        self._wake.set()

    def wait(self, native_id: str, timeout: float | None = None) -> WorkerExit | None:
        job = self.get(native_id)
        if job is None:
            raise KeyError(native_id)
        job.done.wait(timeout)
        return job.result

    def close(self) -> None:
        """Stop watching; a ``wait`` still blocked returns ABORTED (the job itself is left)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
            live = [j for j in self._jobs.values() if j.result is None]
        self._wake.set()
        if thread is not None:
            thread.join(timeout=10)
        for job in live:
            job.result = WorkerExit(
                Outcome.ABORTED,
                f"the site parent stopped watching Slurm job {job.native_id}; it may still run",
            )
            job.done.set()

    # ----- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        step = 0
        while True:
            self._wake.clear()  # before reading the jobs: a watch() from now on is not missed
            with self._lock:
                if self._stopped:
                    return
                live = [j for j in self._jobs.values() if j.result is None]
            if not live:
                self._wake.wait()
                step = 0
                continue
            changed = self.poll_once(live)
            step = 0 if changed else min(step + 1, len(self._backoff) - 1)
            if self._wake.wait(self._backoff[step]):
                step = 0

    def poll_once(self, live: list[Watched]) -> bool:
        """One batched query for ``live``; True when anything changed."""
        try:
            states = self._query([j.native_id for j in live])
        except Exception as err:  # a failed poll: keep last known states, try again later
            log.warning("polling Slurm for jobs %s failed: %s", _ids(live), err)
            return False
        changed = False
        for job in live:
            state = states.get(job.native_id)
            if state is None:
                changed |= self._unknown(job)
            else:
                job.unknown_rounds = 0
                changed |= self._apply(job, state)
        return changed

    def _apply(self, job: Watched, state: JobState) -> bool:
        changed = state.state != job.state
        job.state = state.state
        if state.final:
            result = job.forced or final_exit(
                state,
                cancelled_by_atoll=job.cancelled,
                mem=job.mem,
                time=job.time_limit,
                log=job.log_file,
            )
            self._finish(job, result)
            return True
        if not state.known and changed:
            log.info("Slurm job %s is in state %s: waiting", job.native_id, state.state)
        if state.waiting and job.forced is None and self._pending_too_long(job):
            reason = state.reason or "None"
            job.forced = WorkerExit(
                Outcome.FAILED,
                f"Slurm job {job.native_id} was still pending after its pending_timeout of "
                f"{job.pending_timeout:g} s (Slurm's reason: {reason}); cancelled",
            )
            self._cancel_quietly(job)
            return True
        note = progress_note(state)
        if note != job.note:
            job.note = note
            self._progress(job, note)
            changed = True
        return changed

    def _unknown(self, job: Watched) -> bool:
        job.unknown_rounds += 1
        if job.unknown_rounds < LOST_AFTER_ROUNDS:
            return False
        result = job.forced or WorkerExit(
            Outcome.ABORTED if job.cancelled else Outcome.FAILED,
            f"Slurm no longer knows job {job.native_id} (neither squeue nor sacct lists it)",
        )
        self._finish(job, result)
        return True

    def _pending_too_long(self, job: Watched) -> bool:
        timeout = job.pending_timeout
        return timeout is not None and self._clock() - job.submitted > timeout

    def _cancel_quietly(self, job: Watched) -> None:
        try:
            self._cancel(job.native_id)
        except Exception as err:
            log.warning("cancelling Slurm job %s failed: %s", job.native_id, err)

    def _progress(self, job: Watched, note: str) -> None:
        if job.on_progress is None:
            return
        try:
            job.on_progress(note)
        except Exception:
            log.exception("progress callback of Slurm job %s failed", job.native_id)

    def _finish(self, job: Watched, result: WorkerExit) -> None:
        if job.on_final is not None:
            try:
                job.on_final()
            except Exception:
                log.exception("cleanup of Slurm job %s failed", job.native_id)
        job.result = result
        job.done.set()


def _ids(jobs: list[Watched]) -> str:
    return ",".join(j.native_id for j in jobs)
