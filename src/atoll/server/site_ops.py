"""What the sites' calls do, as plain functions: no gRPC, no event loop.

The Federation servicer (server/federation_service.py) unpacks a call, parses its body
(wire/bodies.py), calls one of these and maps what it raises to a status code: `NotRunning`
is NOT_FOUND, a `ValueError` (a body or an id out of its grammar) INVALID_ARGUMENT. Every job
a site names is looked up as running *at that site*: a site never reaches another site's job.
The ids that reach these functions are of their grammar: the parsers and the servicer check
them where they arrive.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.spec.errors import EXIT_NOT_FOUND, AtollError
from atoll.spec.versions import version_refusal
from atoll.wire.bodies import Heartbeat, Hello, JobState, SiteReport

if TYPE_CHECKING:
    from atoll.server.jobs import LiveJob
    from atoll.server.site_links import SiteLink
    from atoll.server.store import Store

log = logging.getLogger("atoll.server.federation")
GONE = "the server no longer runs this job"  # the reason sent with a reconnect's abort


class SiteJobs(Protocol):
    """What the sites' calls do to the jobs (server/jobs.py)."""

    def running_at(self, job_id: str, site: str) -> LiveJob | None: ...

    def app_zip(self, job_id: str, target: str) -> Path: ...

    def site_state(self, site: str, body: dict[str, Any]) -> None: ...

    def site_offline(self, site: str) -> None: ...

    def parts_at(self, site: str) -> list[str]: ...

    def site_back(self, site: str, running: list[str], known: list[str]) -> None: ...


class NotRunning(AtollError):
    """The job a site named does not run at that site (or at all): NOT_FOUND."""

    exit_code = EXIT_NOT_FOUND

    def __init__(self, job_id: str, site: str):
        super().__init__(f"job {job_id} is not running at {site}")


def running(jobs: SiteJobs, job_id: str, site: str) -> LiveJob:
    """The live job ``job_id`` at ``site``. Its id is of its grammar already: checked by the
    body's parser or the servicer before any lookup (one check, where the id arrives)."""
    live = jobs.running_at(job_id, site)
    if live is None:
        raise NotRunning(job_id, site)
    return live


def hello_refusal(hello: Hello, server_version: str) -> str | None:
    """Why a site's hello is refused (its version, spec/versions.py), or None."""
    return version_refusal(hello.version, server_version)


def stale_jobs(jobs: SiteJobs, site: str, running_jobs: list[str]) -> list[str]:
    """The jobs a reconnecting site still runs that the server no longer does: each is to be
    aborted there."""
    return [job_id for job_id in running_jobs if jobs.running_at(job_id, site) is None]


def heartbeat(link: SiteLink, beat: Heartbeat) -> None:
    link.hello["running_jobs"] = beat.running_jobs


def job_state(jobs: SiteJobs, site: str, state: JobState) -> None:
    jobs.site_state(site, state.doc)


def report(store: Store, jobs: SiteJobs, site: str, body: SiteReport) -> None:
    """A site's progress event, kept for a job it runs."""
    running(jobs, body.job_id, site)
    store.add_event(body.job_id, site, body.event)


def app_zip(jobs: SiteJobs, site: str, job_id: str) -> Path:
    """The app a site fetches for a job it runs (the first fetch builds the zip)."""
    running(jobs, job_id, site)
    return jobs.app_zip(job_id, site)


def back(jobs: SiteJobs, site: str, running: list[str], known: list[str]) -> None:
    """A site connected again: its parts that had not ended go on, or start again there."""
    try:
        jobs.site_back(site, running, known)
    except Exception:  # noqa: BLE001
        log.exception("could not take back the parts of %s", site)


def offline(jobs: SiteJobs, site: str) -> None:
    """A site's link closed: its parts of running jobs wait for it (supervision.rejoin_s),
    then fail. Nobody awaits this: say what went wrong rather than raise."""
    try:
        jobs.site_offline(site)
    except Exception:  # noqa: BLE001
        log.exception("could not mark the jobs of %s as failed", site)
