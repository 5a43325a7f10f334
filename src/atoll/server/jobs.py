"""The life of a job on the server: dispatch, the server worker, the parts' states, the end.

What comes before is server/intake.py's (a job taken in, checked, queued) and the scheduler's
(when it can run); the apps' zips the participants fetch are server/app_zips.py's.

A job is SUBMITTED until the scheduler dispatches it, then each participant (the server and
every site) moves through DISPATCHED -> STARTING -> RUNNING -> FINISHED:<outcome> with a reason.
The job ends when the server's part and every site's part have ended: COMPLETED when the
workflow completed (sites it tolerated losing are named in the reason), otherwise FAILED or
ABORTED with the reason that decided it.

A job signed by a user whose certificate is revoked never starts, whatever its state says:
the signer is checked (server/job_signer.py) when a newer revocation list arrives (waiting
jobs are cancelled, running ones aborted: `signers_revoked`), at dispatch, and just before the
server worker is launched.

The job manager composes one module per concept: server/dispatch.py (a job made live and sent),
server/server_worker.py (the server worker's launch), server/lifecycle.py (the parts' states,
the job's end, abort, a newer revocation list, recovery); server/live_jobs.py holds the live
job and what the server worker's backend may ask of it. The signer check (`_revoked`) stays
here, one function all three call.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.base.files import private_dir
from atoll.server.app_zips import AppZips
from atoll.server.dispatch import Dispatch
from atoll.server.intake import Intake, IntakeLimits, JobQueue
from atoll.server.job_signer import revoked_signer
from atoll.server.lifecycle import END_GRACE_S, FAILED_GRACE_S, Lifecycle
from atoll.server.live_jobs import HeldRevocations, LiveJob
from atoll.server.server_worker import ServerWorkerLaunch
from atoll.server.spool import Budget
from atoll.server.store import JobRecord

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher, LaunchRequest
    from atoll.parent.worker_endpoint import WorkerTokens
    from atoll.pki.identity import Identity
    from atoll.pki.revocation import RevocationList
    from atoll.server.job_signing import SubmissionCheck
    from atoll.server.provenance import ServerProvenance
    from atoll.server.site_links import SiteLink
    from atoll.server.store import Store
    from atoll.server.studies import StudySites
    from atoll.spec.meta_plain import Meta

__all__ = ["END_GRACE_S", "FAILED_GRACE_S", "HeldRevocations", "JobManager", "LiveJob",
           "job_summary", "revoked_signer"]

# Payload bytes the relays of all jobs keep in memory; the rest spills to the jobs' folders.
RELAY_MEMORY = 4 * 1024 * 1024


class SiteCommands(Protocol):
    """The connected sites (server/site_links.py): their control streams (send: False if the
    site is offline) and the capacity each reported."""

    def send(self, site: str, kind: str, body: dict[str, Any]) -> bool: ...

    def online(self) -> dict[str, SiteLink]: ...


class WorkerHost(Protocol):
    """Where the server worker runs: the server parent's launcher, and the request that starts
    a worker on it (server/app.py)."""

    @property
    def launcher(self) -> Launcher: ...

    def launch_request(self, record: JobRecord, meta: Meta, run_dir: Path, token: str,
                       shared: tuple[Path, ...] = ()) -> LaunchRequest: ...


class JobManager(Dispatch, ServerWorkerLaunch, Lifecycle):
    def __init__(self, *, store: Store, studies: StudySites, links: SiteCommands,
                 queue: JobQueue, host: WorkerHost, tokens: WorkerTokens,
                 check: SubmissionCheck, limits: IntakeLimits, workspace: Path,
                 revocations: HeldRevocations, provenance: ServerProvenance | None = None):
        self.store = store
        self.studies = studies
        self.links = links
        self.queue = queue
        self.host = host
        self.tokens = tokens
        self.check = check  # a submission's signature and signer
        self.limits = limits
        self.workspace = workspace
        self.revocations = revocations
        self.provenance = provenance  # each job's signed record (server/provenance.py)
        self.jobs_dir: Path = workspace / "jobs"
        private_dir(self.jobs_dir)
        self.live: dict[str, LiveJob] = {}
        self._lock = threading.RLock()
        self.relay_budget = Budget(RELAY_MEMORY)
        self.max_resumes = 3  # the server's restarts.max_resumes (server/app.py sets it)
        self.intake = Intake(store=store, studies=studies, links=links, queue=queue,
                             check=check, limits=limits, workspace=workspace,
                             jobs_dir=self.jobs_dir, provenance=provenance)
        self.app_zips = AppZips(self.jobs_dir)

    # -- intake and the apps' zips (server/intake.py, server/app_zips.py) ----------------------
    def submit(self, who: Identity, study: str, chunks: Iterator[bytes]) -> JobRecord:
        return self.intake.submit(who, study, chunks)

    def app_zip(self, job_id: str, target: str) -> Path:
        live = self.live.get(job_id)
        return self.app_zips.get(job_id, target, live.meta if live is not None else None)

    def running(self, job_id: str) -> LiveJob | None:
        """The job, if it runs now (server/live_jobs.py's RunningJobs)."""
        return self.live.get(job_id)

    def _revoked(self, tree: Path, held: RevocationList | None = None) -> str | None:
        """Why the job stored at ``tree`` may not run: its signer revoked by ``held`` (the list
        held now by default), or None (server/job_signer.py)."""
        return revoked_signer(tree, self.revocations.current if held is None else held)


def job_summary(record: JobRecord) -> dict[str, Any]:
    """The record as a status shows it: a copy, never the record's own dicts. (Not through
    JSON and back: at 10,000 sites that took 13 ms of every status call.)"""
    out = record.summary()
    out["parts"] = {name: dict(part) for name, part in record.parts.items()}
    out["deploy_map"] = json.loads(json.dumps(record.meta.get("deploy_map")))
    return out

