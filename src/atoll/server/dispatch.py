"""Dispatch: a job the scheduler chose is made live, sent to its sites, and its server worker
started (server/server_worker.py); what the running jobs hold at each site, for the scheduler.

The job's signer is checked against the list held now, in the same lock that makes the job
live: `signers_revoked` (server/lifecycle.py) sees the job either waiting or live, never neither.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from atoll.server.live_jobs import LiveJob
from atoll.server.relay import JobRelay
from atoll.server.site_links import ControlTooLarge

if TYPE_CHECKING:
    from atoll.server.jobs import SiteCommands, WorkerHost
    from atoll.server.spool import Budget
    from atoll.server.store import JobRecord, Store
    from atoll.spec.meta_plain import Meta
    from atoll.spec.resources import Resources

log = logging.getLogger("atoll.server.jobs")


class Dispatch:
    """The dispatch part of the job manager (server/jobs.py composes it)."""

    store: Store
    links: SiteCommands
    host: WorkerHost
    jobs_dir: Path
    live: dict[str, LiveJob]
    relay_budget: Budget
    _lock: threading.RLock

    # (`_abort_sites(live, reason)` is server/lifecycle.py's: see JobManager)

    def held(self) -> dict[str, list[Resources]]:
        """What the running jobs hold at each site, until that site's part has ended."""
        used: dict[str, list[Resources]] = {}
        for live in list(self.live.values()):
            for site, res in live.resources.items():
                if site not in live.site_states:
                    used.setdefault(site, []).append(res)
        return used

    def running_at(self, job_id: str, site: str) -> LiveJob | None:
        """The job, if it runs now and ``site`` takes part in it."""
        live = self.live.get(job_id)
        return live if live is not None and site in live.members else None

    def dispatch(self, record: JobRecord, meta: Meta, sites: list[str],
                 skipped: dict[str, str], resources: dict[str, Resources]) -> None:
        folder = self.jobs_dir / record.id
        with self._lock:  # checked and made live at once: `signers_revoked` sees one or other
            why = self._revoked(folder / "job")
            if why is not None:
                log.warning("job %s not dispatched: %s", record.id, why)
                self._cancel(record.id, f"cancelled: {why}")
                return
            # the handoff folder, if any, comes with the server worker's launch: the launcher
            # (and its settings' models) is made after the sites are sent the job
            relay = JobRelay(record.id, folder / "relay", sites, self.relay_budget)
            live = LiveJob(record, meta, sites, relay, folder, resources=resources)
            self.live[record.id] = live
        record.state = "DISPATCHED"
        self.store.set_job_state(record.id, "DISPATCHED")
        # all stored before any is sent: a site's STARTING never lands under its DISPATCHED
        self.store.set_part_states(record.id, {
            **{site: ("FINISHED:FAILED", reason) for site, reason in skipped.items()},
            **{site: ("DISPATCHED", "") for site in sites}})
        try:
            self.links.send_all(sites, "dispatch", dispatch_body(record))
        except ControlTooLarge as exc:  # intake bounds the meta: only a bug gets here
            for site in sites:
                self.site_state(site, {"job_id": record.id, "state": "FINISHED:FAILED",
                                       "reason": f"the job could not be sent to {site}: {exc}"})
        if live.aborting:  # aborted while its sites were sent it: the abort may have gone
            self._abort_sites(live, live.aborting)  # first, to a site that knew no such job
        threading.Thread(target=self._run_server_worker, args=(live,),
                         name=f"server-worker-{record.id[:8]}", daemon=True).start()


def dispatch_body(record: JobRecord) -> dict:
    """What a site is sent to run its part: again after its site parent restarted."""
    return {"job_id": record.id, "name": record.name, "study": record.study,
            "meta": record.meta}
