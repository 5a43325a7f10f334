"""The scheduler: dispatches each SUBMITTED job, oldest first, once it can run.

A job can run when its mandatory sites are online, at least `min_clients` of its sites are
online (all of them when unset), and every site it would use has room for what the job asks
(the capacity each site reported, minus what its running jobs hold). Until then the job stays
SUBMITTED with a reason that says what it is waiting for.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from atoll.spec.capacity import fits
from atoll.spec.errors import SpecError

if TYPE_CHECKING:
    from atoll.spec.resources import Resources

log = logging.getLogger("atoll.server.scheduler")

TICK_S = 1.0


class Scheduler:
    def __init__(self, parent):
        self.parent = parent
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the scheduler must outlive one bad job
                log.exception("scheduler tick failed")

    def tick(self) -> None:
        store = self.parent.store
        for record in sorted(store.list_jobs(states=["SUBMITTED"]), key=lambda r: r.seq):
            reason = self._try(record)
            if reason is not None and reason != record.reason:
                store.set_job_state(record.id, "SUBMITTED", reason)

    def _used(self) -> dict[str, list[Resources]]:
        used: dict[str, list[Resources]] = {}
        for live in list(self.parent.jobs.live.values()):
            for site, res in live.resources.items():
                if site not in live.site_states:
                    used.setdefault(site, []).append(res)
        return used

    def _try(self, record) -> str | None:
        """Dispatch the job if it can run now; otherwise return what it waits for."""
        # The spec models import pydantic: only once there is a job, not in a parent at rest.
        from atoll.spec.meta import load_meta
        from atoll.spec.resources import resolve_resources

        try:
            meta = load_meta(record.meta)
        except SpecError as exc:
            self.parent.jobs.abort(record.id, f"meta.json no longer valid: {exc}")
            return None
        study_sites = self.parent.studies.sites(record.study)
        targets = [t for t in meta.expand_targets(study_sites) if t != "server"]
        # Never dispatch outside the study, even to a site removed after the job was submitted.
        sites = [t for t in targets if t in study_sites]
        online = self.parent.links.online()
        missing = [s for s in meta.mandatory_clients if s not in online]
        if missing:
            return f"waiting for mandatory site(s) {', '.join(missing)} to come online"
        ready = [s for s in sites if s in online]
        needed = meta.min_clients or len(sites)
        if len(ready) < needed:
            return (f"waiting for sites: {len(ready)} of {len(sites)} online, "
                    f"{needed} needed (min_clients)")
        used = self._used()
        resources: dict[str, Resources] = {}
        for site in ready:
            asked = resolve_resources(meta.resource_spec, site)
            short = fits(online[site].capacity, used.get(site, []), asked)
            if short:
                return f"waiting for resources at {site}: {short}"
            resources[site] = asked
        skipped = {s: "not dispatched: the site was offline" for s in sites if s not in online}
        skipped.update({s: f"not dispatched: no longer enrolled in study {record.study}"
                        for s in targets if s not in study_sites})
        self.parent.jobs.dispatch(record, ready, skipped, resources)
        return None
