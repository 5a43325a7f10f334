"""The scheduler: dispatches each SUBMITTED job, oldest first, once it can run.

A job can run when its mandatory sites are online, at least `min_clients` of its sites are
online (all of them when unset), and every site it would use has room for what the job asks
(the capacity each site reported, minus what its running jobs hold). Until then the job stays
SUBMITTED with a reason that says what it is waiting for.

What it drives is what it receives (server/app.py wires them): the job queue intake fills, the
store it lists waiting jobs from, the studies' sites, the links' online sites and their
capacity, and the jobs it dispatches or aborts.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol

from atoll.spec.admission import asked_at, fits, reachable_sites
from atoll.spec.errors import SpecError

if TYPE_CHECKING:
    from atoll.server.site_links import SiteLink
    from atoll.server.store import JobRecord, Store
    from atoll.server.studies import StudySites
    from atoll.spec.meta_plain import Meta
    from atoll.spec.resources import Resources

log = logging.getLogger("atoll.server.scheduler")

TICK_S = 1.0


class OnlineSites(Protocol):
    """The sites connected now, with the capacity each reported (server/site_links.py)."""

    def online(self) -> dict[str, SiteLink]: ...


class Dispatcher(Protocol):
    """What the scheduler does with jobs (server/jobs.py)."""

    def held(self) -> dict[str, list[Resources]]: ...

    def dispatch(self, record: JobRecord, meta: Meta, sites: list[str],
                 skipped: dict[str, str], resources: dict[str, Resources]) -> None: ...

    def abort(self, job_id: str, reason: str) -> None: ...


class JobQueue:
    """The jobs waiting for the scheduler: the meta intake validated for each (kept while the
    job waits, so that no tick parses it again), and the event that wakes the scheduler."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._metas: dict[str, Meta] = {}

    def submitted(self, job_id: str, meta: Meta) -> None:
        """A job intake took in (already in the store), with its validated meta."""
        with self._lock:
            self._metas[job_id] = meta
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def wait(self, timeout: float) -> None:
        self._wake.wait(timeout)
        self._wake.clear()

    def take(self) -> dict[str, Meta]:
        """The metas held so far; the scheduler puts back (`keep`) those of jobs still waiting,
        so that those of jobs dispatched or aborted meanwhile are dropped."""
        with self._lock:
            held, self._metas = self._metas, {}
        return held

    def get(self, job_id: str) -> Meta | None:
        with self._lock:
            return self._metas.get(job_id)

    def keep(self, job_id: str, meta: Meta) -> None:
        with self._lock:
            self._metas.setdefault(job_id, meta)


class Scheduler:
    def __init__(self, queue: JobQueue, store: Store, studies: StudySites,
                 links: OnlineSites, jobs: Dispatcher):
        self.queue = queue
        self.store = store
        self.studies = studies
        self.links = links
        self.jobs = jobs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.queue.wake()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.queue.wait(TICK_S)
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the scheduler must outlive one bad job
                log.exception("scheduler tick failed")

    def tick(self) -> None:
        held = self.queue.take()
        for record in sorted(self.store.list_jobs(states=["SUBMITTED"]), key=lambda r: r.seq):
            meta = held.get(record.id)
            if meta is None:  # handed over since `take`, or submitted before a restart
                meta = self.queue.get(record.id)
            if meta is None and (meta := self._load(record)) is None:
                continue
            self.queue.keep(record.id, meta)  # while it waits; a dispatched one is dropped next
            reason = self._try(record, meta)
            if reason is not None and reason != record.reason:
                self.store.set_job_state(record.id, "SUBMITTED", reason)

    def _load(self, record: JobRecord) -> Meta | None:
        """The meta of a job intake did not hand over (one submitted before a restart),
        validated once; None, and the job aborted, when it is no longer valid."""
        from atoll.spec.meta import load_meta  # pydantic: only once there is a job

        try:
            return load_meta(record.meta)
        except SpecError as exc:
            self.jobs.abort(record.id, f"meta.json no longer valid: {exc}")
            return None

    def _try(self, record: JobRecord, meta: Meta) -> str | None:
        """Dispatch the job if it can run now; otherwise return what it waits for."""
        study_sites = self.studies.sites(record.study)
        targets = [t for t in meta.expand_targets(study_sites) if t != "server"]
        sites = reachable_sites(meta, study_sites)  # never outside the study
        online = self.links.online()
        missing = [s for s in meta.mandatory_clients if s not in online]
        if missing:
            return f"waiting for mandatory site(s) {', '.join(missing)} to come online"
        ready = [s for s in sites if s in online]
        needed = meta.min_clients or len(sites)
        if len(ready) < needed:
            return (f"waiting for sites: {len(ready)} of {len(sites)} online, "
                    f"{needed} needed (min_clients)")
        used = self.jobs.held()
        resources: dict[str, Resources] = {}
        for site in ready:
            asked = asked_at(meta, site, online[site].launcher)
            short = fits(online[site].capacity, used.get(site, []), asked)
            if short:
                return f"waiting for resources at {site}: {short}"
            resources[site] = asked
        skipped = {s: "not dispatched: the site was offline" for s in sites if s not in online}
        skipped.update({s: f"not dispatched: no longer enrolled in study {record.study}"
                        for s in targets if s not in study_sites})
        self.jobs.dispatch(record, meta, ready, skipped, resources)
        return None


def never_fits(meta: Meta, targets: list[str], online: dict[str, SiteLink]) -> list[str]:
    """The online target sites whose whole capacity is less than the job asks there. The
    scheduler starts a job only when it fits at every online target, so while such a site
    reports that capacity the job could never start: intake refuses it."""
    problems = []
    for site in targets:
        link = online.get(site)
        if link is None:
            continue  # offline: its capacity is not known now
        try:
            short = fits(link.capacity, [], asked_at(meta, site, link.launcher))
        except SpecError as exc:
            problems.append(f"resource_spec for site {site!r}: {exc}")
            continue
        if short:
            problems.append(f"resource_spec: site {site!r} could never run this job: {short} "
                            "with nothing else running there; ask less for it (a per-site "
                            "entry of resource_spec) or leave it out of deploy_map")
    return problems
