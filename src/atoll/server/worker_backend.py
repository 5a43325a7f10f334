"""What the server's own worker (the workflow) can do through the server parent's endpoint:
send tasks to sites, take their replies, report and finish (the site's side: site/worker_backend.py).

It sees the jobs through `RunningJobs` (server/live_jobs.py), never the job manager's table."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.base.reasons import clip
from atoll.parent.worker_endpoint import BackendError
from atoll.server.live_jobs import LiveJob, RunningJobs
from atoll.server.relay import RelayError
from atoll.spec.names import IdentifierError, check_task_name
from atoll.wire import frames, handoff

if TYPE_CHECKING:
    from atoll.server.store import Store

log = logging.getLogger(__name__)

# For measuring the checkpoint's cost only (bench/compare's atoll-nockpt): a server parent
# started with this variable set to 1 tells its server workers to keep no checkpoint (a server
# restart then runs their jobs again from round 1), and says so in its log.
BENCHMARK_OFF = "ATOLL_BENCHMARK_NO_CHECKPOINT"


class RoundStatements(Protocol):
    """Where a round report's model digest goes: the job's provenance record
    (server/provenance.py's ServerProvenance)."""

    def round_model(self, job_id: str, round_: Any, digest: Any) -> None: ...


class ServerWorkerBackend:
    """What the server worker (the workflow) can do through the server parent's endpoint."""

    def __init__(self, jobs: RunningJobs, store: Store, ca_file: Path,
                 rounds: RoundStatements | None = None):
        self.jobs = jobs
        self.store = store
        self.ca_pem = ca_file.read_text(encoding="ascii")
        self.checkpoints = os.environ.get(BENCHMARK_OFF) != "1"
        if not self.checkpoints:
            log.warning("%s=1: this server's jobs keep no checkpoint and cannot resume after a "
                        "restart (for benchmarks only)", BENCHMARK_OFF)
        self.rounds = rounds  # None: this server keeps no provenance records

    def _live(self, job_id: str) -> LiveJob:
        live = self.jobs.running(job_id)
        if live is None:
            raise BackendError(f"job {job_id} is not running")
        return live

    def on_register(self, job_id: str) -> dict[str, Any]:
        live = self._live(job_id)
        # server/lifecycle.py; a resumed job's part keeps saying so while it runs
        self.jobs.part_running(live, "server", live.resume_note)
        info = {"sites": live.sites,
                "job_args": {"min_clients": live.meta.min_clients, "name": live.meta.name}}
        if live.resumes:  # after a server restart: the workflow goes on from its checkpoint
            info["job_args"]["resume"] = {"attempt": live.resumes, "round": live.resume_round}
        if not self.checkpoints:
            info["checkpoints"] = False
        if live.relay.handoff is not None:
            info["handoff"] = str(live.relay.handoff.path)
        # what the worker checks the job's signature against before it runs any of its code
        # (worker/signed_job.py): the project's root CA and the revocation list held now
        info["trust"] = {"ca": self.ca_pem, "crl": self.jobs.revocations.current.pem}
        return info

    def app_zip(self, job_id: str) -> Path:
        self._live(job_id)
        return self.jobs.app_zip(job_id, "server")

    def send_task(self, job_id, head, chunks):
        relay = self._live(job_id).relay
        try:  # the job's workflow names the task: its name goes to every site's worker
            topic = check_task_name(head.get("topic"), "the task's topic")
        except IdentifierError as exc:
            raise BackendError(str(exc)) from None
        try:
            task_id = relay.add_task(
                list(head.get("targets") or []), topic,
                dict(head.get("headers") or {}), handoff.payload_of(head, chunks, relay.handoff))
        except RelayError as exc:
            raise BackendError(str(exc)) from None
        return {"task_id": task_id}

    def next_reply(self, job_id, task_id, wait_s, many=False, as_files=False):
        relay = self._live(job_id).relay
        as_files = as_files and relay.handoff is not None
        try:
            entry = relay.next_reply(task_id, min(max(wait_s, 0.0), 30.0))
        except RelayError as exc:
            raise BackendError(str(exc)) from None
        if entry is None:
            yield frames.header({"none": True})
        while entry is not None:
            if entry.error is not None:
                yield frames.header({"site": entry.site, "error": entry.error,
                                     **({"retry": True} if entry.retry else {})})
            elif as_files:  # the worker reads the reply's own file (wire/handoff.py)
                yield frames.header({"site": entry.site, "headers": entry.headers,
                                     handoff.KEY: entry.spool.hand_over()})
            else:
                yield frames.header({"site": entry.site, "headers": entry.headers})
                yield from entry.spool.read("workflow")
            # replies already waiting follow in the same call: at a thousand sites, a call
            # per reply cost the workflow more than the replies did
            entry = relay.next_reply(task_id, 0) if many else None

    def next_task(self, job_id, wait_s, as_files=False):
        raise BackendError("the server worker runs the workflow; it takes no tasks")

    def send_reply(self, job_id, head, chunks):
        raise BackendError("the server worker runs the workflow; it sends no replies")

    def spend_budget(self, job_id, body):
        raise BackendError("the server worker releases nothing a site's privacy ledger counts")

    def run_folder(self, job_id):
        return self._live(job_id).folder / "run" / "server"

    def keep_checkpoint(self, job_id, chunks):
        """A Pod's checkpoint, kept in the job's own folder (wire/checkpoint_home.py)."""
        from atoll.wire.checkpoint_home import keep_checkpoint

        return keep_checkpoint(chunks, self._live(job_id).folder)

    def held_checkpoint(self, job_id):
        from atoll.wire.checkpoint_home import held_checkpoint

        return held_checkpoint(self._live(job_id).folder)

    def report(self, job_id, body):
        self._live(job_id)
        self.store.add_event(job_id, "server", body)
        if (self.rounds is not None and body.get("event") in ("round", "round_model")
                and "model_digest" in body):
            # as the round happens, not at the job's end: a record read mid-job names it
            # (FedAvg states it just after its round report, beside the next round's send)
            self.rounds.round_model(job_id, body.get("round"), body["model_digest"])

    def finish(self, job_id, ok, error):
        live = self._live(job_id)
        live.report = (ok, clip(str(error or "")))  # job code's text: it goes to every site
        if ok:  # the workflow is over: the sites wind down while its process exits
            live.relay.end()
