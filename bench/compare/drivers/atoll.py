"""atoll's driver for the side-by-side benchmark: to be filled in once the federation exists.

What each method must do (the FLARE and Flower drivers beside this file are worked examples):

- prepare(): provision a fresh federation (server, site-1, site-2, one admin kit) under
  self.workdir, e.g. `atoll provision` or what `atoll poc up` does, without starting it.
- start_deployment(): start the server parent and two site parents as separate processes with
  mutual TLS (self.spawn(...) for each, so they are tagged and measured); do not wait.
- wait_ready(timeout): return once the server accepts the admin and lists both sites online
  (poll with one kept Session, ~0.1 s period, as flare/ctl.py and flower/ctl.py do).
- prepare_job(model_mb, rounds, mark_dir): write a FedAvg job folder whose model is the float32
  layers of drivers.base.layer_elems(model_mb), min_clients 2, and whose site script adds 1.0
  to every weight and appends "recv <round> <unix time>" to <mark_dir>/<site>.marks on receipt.
- submit(job): `atoll job submit JOB_DIR --kit ADMIN_KIT --format json` via self.run_cmd,
  JobRun(job_id, submitted_at=time before the command).
- wait_finished(run, timeout): wait until the job is FINISHED:*; set run.finished_at (the time
  it was first seen finished) and run.status.
- abort(run): `atoll job abort ID --kit ADMIN_KIT`.  list_jobs(): `atoll job list --kit ...`.
- stop_deployment(): `atoll server stop` / `atoll site stop` (or `atoll poc down`).
- is_job_process(cmdline): True for worker processes ("-m atoll.worker").
- missing(): None once all of the above works.
"""

from __future__ import annotations

from pathlib import Path

from drivers.base import Driver, JobRun

NOT_YET = "the atoll driver is not written yet: fill in bench/compare/drivers/atoll.py"


class AtollDriver(Driver):
    name = "atoll"
    title = "atoll"

    def missing(self) -> str | None:
        return NOT_YET

    def prepare(self) -> None:
        raise NotImplementedError(NOT_YET)

    def start_deployment(self) -> None:
        raise NotImplementedError(NOT_YET)

    def wait_ready(self, timeout: float) -> None:
        raise NotImplementedError(NOT_YET)

    def prepare_job(self, model_mb: float, rounds: int, mark_dir: Path) -> object:
        raise NotImplementedError(NOT_YET)

    def submit(self, job: object) -> JobRun:
        raise NotImplementedError(NOT_YET)

    def wait_finished(self, run: JobRun, timeout: float) -> None:
        raise NotImplementedError(NOT_YET)

    def abort(self, run: JobRun) -> None:
        raise NotImplementedError(NOT_YET)

    def list_jobs(self) -> None:
        raise NotImplementedError(NOT_YET)

    def stop_deployment(self) -> None:
        raise NotImplementedError(NOT_YET)

    def is_job_process(self, cmdline: str) -> bool:
        return "atoll.worker" in cmdline
