"""What Slurm's job states mean for a worker: one table, and parsers of squeue / sacct output.

Pure. ``squeue`` reports live jobs (state, pending reason, nodes, raw exit status) and keeps
finished ones for ``MinJobAge``; ``sacct`` (with slurmdbd) remembers them afterwards. A state not
in the table is treated as "not finished", as submitit does: a newer Slurm may add states.

| Slurm state                    | atoll     | reason                                             |
|--------------------------------|-----------|----------------------------------------------------|
| COMPLETED                      | COMPLETED | worker exited with code 0                          |
| FAILED                         | FAILED    | worker exited with code N (or signal)              |
| OUT_OF_MEMORY                  | FAILED    | out of memory (--mem=...)                          |
| TIMEOUT                        | FAILED    | over its time limit (--time=...)                   |
| NODE_FAIL, BOOT_FAIL           | FAILED    | a node failed / did not boot                       |
| DEADLINE                       | FAILED    | reached its --deadline                             |
| SPECIAL_EXIT                   | FAILED    | exited with Slurm's special exit code              |
| CANCELLED                      | ABORTED   | cancelled by atoll, or outside atoll               |
| PREEMPTED, REVOKED             | ABORTED   | preempted / revoked by Slurm                       |
| PENDING, RUNNING, COMPLETING,  | (running) | "pending: <Reason>", "running on <nodes>"          |
| CONFIGURING, SUSPENDED, ...    |           |                                                    |
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from atoll.launchers.base import Outcome, WorkerExit

SQUEUE_FIELDS = "JobID:|,State:|,Reason:|,NodeList:|,exit_code:|"
SACCT_FIELDS = "JobIDRaw,State,ExitCode"

# state -> (outcome, what happened); {code}, {mem}, {time}, {log} are filled from the job.
FINAL_STATES: dict[str, tuple[Outcome, str]] = {
    "COMPLETED": (Outcome.COMPLETED, "worker exited with code 0"),
    "FAILED": (Outcome.FAILED, "worker {code}; see {log}"),
    "OUT_OF_MEMORY": (
        Outcome.FAILED,
        "OUT_OF_MEMORY: out of memory (limit {mem}); ask for more memory in resource_spec",
    ),
    "TIMEOUT": (
        Outcome.FAILED,
        "TIMEOUT: over its time limit ({time}); raise launcher_spec slurm.time",
    ),
    "NODE_FAIL": (Outcome.FAILED, "NODE_FAIL: a node of the job failed; see {log}"),
    "BOOT_FAIL": (Outcome.FAILED, "BOOT_FAIL: a node of the job did not boot"),
    "DEADLINE": (Outcome.FAILED, "DEADLINE: the job reached its deadline before it ended"),
    "SPECIAL_EXIT": (Outcome.FAILED, "SPECIAL_EXIT: the worker {code}; see {log}"),
    "CANCELLED": (Outcome.ABORTED, "CANCELLED outside atoll (scancel by a user or an admin)"),
    "PREEMPTED": (Outcome.ABORTED, "PREEMPTED: Slurm preempted the job for another"),
    "REVOKED": (Outcome.ABORTED, "REVOKED: Slurm revoked the job (federation)"),
}
LIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
        "POWER_UP_NODE",
        "UPDATE_DB",
    }
)
# Not started yet: time in these states counts against pending_timeout.
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})


@dataclass(frozen=True)
class JobState:
    """One job as Slurm reports it."""

    native_id: str
    state: str  # base state word: "CANCELLED by 0" -> "CANCELLED"
    reason: str = ""  # squeue's pending/ending reason, e.g. "Resources"
    nodes: str = ""  # e.g. "n[1-2]"
    exit_code: int | None = None  # worker's exit code; -N when killed by signal N

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def known(self) -> bool:
        return self.state in FINAL_STATES or self.state in LIVE_STATES


def decode_wait_status(raw: int) -> int:
    """squeue's exit_code is a raw wait status: 768 -> 3; 15 (SIGTERM) -> -15."""
    sig = raw & 0x7F
    return -sig if sig else raw >> 8


def parse_squeue(text: str) -> dict[str, JobState]:
    """Lines of ``squeue -h -O <SQUEUE_FIELDS>``; a job array's or a malformed line is skipped."""
    jobs: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        job_id, state, reason, nodes, raw = parts[:5]
        code = decode_wait_status(int(raw)) if raw.strip().isdigit() else None
        jobs[job_id] = JobState(job_id, _base(state), reason.strip(), nodes.strip(), code)
    return jobs


def parse_sacct(text: str) -> dict[str, JobState]:
    """Lines of ``sacct -X -P -n --format=<SACCT_FIELDS>``: ``12|CANCELLED by 0|0:15``."""
    jobs: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        job_id, state, exit_code = parts[:3]
        code, _, sig = exit_code.partition(":")
        value = None
        if code.isdigit() and sig.isdigit():
            value = -int(sig) if int(sig) else int(code)
        jobs[job_id] = JobState(job_id, _base(state), "", "", value)
    return jobs


def _base(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``COMPLETING`` stays (squeue shows the flag)."""
    words = state.strip().split()
    return words[0].rstrip("+").upper() if words else ""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "ended"
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def final_exit(
    job: JobState,
    *,
    cancelled_by_atoll: bool = False,
    mem: str | None = None,
    time: str | None = None,
    log: str = "the job's logs",
) -> WorkerExit:
    """The WorkerExit for a finished job (``job.final`` must be true)."""
    outcome, text = FINAL_STATES[job.state]
    code = job.exit_code
    if job.state == "CANCELLED" and cancelled_by_atoll:
        return WorkerExit(
            Outcome.ABORTED, f"cancelled (scancel of Slurm job {job.native_id})", code
        )
    reason = text.format(
        code=describe_exit(code),
        mem=f"--mem={mem}" if mem else "no --mem: the partition's default",
        time=f"--time={time}" if time else "the partition's limit",
        log=log,
    )
    return WorkerExit(outcome, f"Slurm job {job.native_id}: {reason}", code)


# srun's own line for a task that failed, e.g. "srun: error: n2: task 1: Killed". The ranks'
# output is labelled ("1: ...", srun --label), so a script cannot print one by accident.
_SRUN_TASK_ERROR = re.compile(
    r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9][0-9,-]*): (?P<what>.+)$", re.M
)


def first_failed_task(log_text: str) -> tuple[str, str, str] | None:
    """``(tasks, node, what)`` of the first failed task srun reports in a job's log."""
    match = _SRUN_TASK_ERROR.search(log_text)
    return (match["tasks"], match["node"], match["what"].strip()) if match else None


def progress_note(job: JobState) -> str:
    """What the site shows while the job lives: ``pending: Resources``, ``running on n1``."""
    if job.state == "PENDING":
        return f"pending: {job.reason or 'None'}"
    if job.state == "RUNNING":
        return f"running on {job.nodes}" if job.nodes else "running"
    return job.state.lower()
