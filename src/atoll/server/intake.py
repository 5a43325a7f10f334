"""A job taken in: received within the limits, unpacked, checked, and queued for the scheduler.

The checks, before anything is kept: meta.json is valid; the study's rules
(spec/admission.py: its sites enrolled, ``mandatory_clients`` and ``min_clients`` reachable);
no online site could never run it (server/scheduler.py's ``never_fits``); every app folder is
there; and the signature is the submitter's, for this study (server/job_signing.py). A refusal
is an IntakeError naming the entry or field, never one of the server's paths.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from atoll.base.files import private_dir
from atoll.base.reasons import clip_details, public
from atoll.server.scheduler import never_fits
from atoll.spec.admission import reachable_sites, study_issues
from atoll.spec.errors import SpecError
from atoll.spec.meta_plain import META_FILE, read_meta, read_meta_bytes
from atoll.wire.job_archive import Incoming, IntakeError

if TYPE_CHECKING:
    from atoll.pki.identity import Identity
    from atoll.server.job_signing import SubmissionCheck
    from atoll.server.provenance import ServerProvenance
    from atoll.server.site_links import SiteLink
    from atoll.server.store import JobRecord, Store
    from atoll.server.studies import StudySites
    from atoll.spec.meta_plain import Meta

log = logging.getLogger("atoll.server.jobs")  # as before the split: what operators grep for


class IntakeLimits(Protocol):
    """How big a submitted job may be (server/app.py's Limits)."""

    @property
    def max_upload_bytes(self) -> int: ...

    @property
    def max_job_bytes(self) -> int: ...


class JobQueue(Protocol):
    """What the scheduler works through (server/scheduler.py)."""

    def submitted(self, job_id: str, meta: Meta) -> None: ...

    def wake(self) -> None: ...


class OnlineSites(Protocol):
    def online(self) -> dict[str, SiteLink]: ...


class Intake:
    def __init__(self, *, store: Store, studies: StudySites, links: OnlineSites,
                 queue: JobQueue, check: SubmissionCheck, limits: IntakeLimits,
                 workspace: Path, jobs_dir: Path, provenance: ServerProvenance | None = None):
        self.store = store
        self.studies = studies
        self.links = links
        self.queue = queue
        self.check = check  # a submission's signature and signer
        self.limits = limits
        self.workspace = workspace
        self.jobs_dir = jobs_dir
        self.provenance = provenance  # the job's record starts with what was taken in

    def submit(self, who: Identity, study: str, chunks: Iterator[bytes]) -> JobRecord:
        """Take a job in; any refusal is an IntakeError naming the entry or field, never one of
        the server's paths (the caller audits it and answers INVALID_ARGUMENT)."""
        scratch = self.workspace / "tmp"
        try:
            return self._submit(who, study, chunks)
        except IntakeError as exc:
            raise IntakeError(clip_details(public(str(exc), [], scratch, 1 << 20))) from None
        except OSError as exc:  # e.g. the disk is full: say so, without the path
            log.warning("job intake failed: %s", exc)
            raise IntakeError(f"the server could not take the job in: {exc.strerror}") from None

    def _submit(self, who: Identity, study: str, chunks: Iterator[bytes]) -> JobRecord:
        limits = self.limits
        with Incoming(self.workspace / "tmp") as incoming:
            incoming.receive(chunks, limits.max_upload_bytes)
            tree = incoming.extract(limits.max_job_bytes)
            meta = _read_meta(tree)
            study_sites = self.studies.sites(study)
            targets = meta.expand_targets(study_sites)
            problems = [f"{i.path}: {i.message}" for i in study_issues(meta, study, study_sites)]
            problems += never_fits(meta, reachable_sites(meta, study_sites), self.links.online())
            for app in meta.deploy_map:
                if not (tree / app).is_dir():
                    problems.append(f"deploy_map: app folder {app!r} is missing from the job")
            if problems:
                raise IntakeError("job refused:\n" + "\n".join(f"- {p}" for p in problems))
            digest = self.check.verify(tree, who, study)  # the signature stays in it
            import uuid  # with the first job, not at rest: it loads platform and libuuid

            job_id = uuid.uuid4().hex
            meta = meta.with_server_fields(study, who.name)
            incoming.keep(private_dir(self.jobs_dir / job_id) / "job")
        record_meta: dict[str, Any] = meta.model_dump(mode="json")
        self.store.add_job(job_id, meta.name, study, who.name, who.org, record_meta, targets)
        if self.provenance is not None:
            self.provenance.taken_in(job_id, study, who.name, digest)
        log.info("job %s submitted by %s in %s, signed, content %s", job_id, who.name, study,
                 digest)
        self.queue.submitted(job_id, meta)  # validated here: the scheduler does not parse it again
        return self.store.get_job(job_id)


def _read_meta(tree: Path) -> Meta:
    """The job's meta.json, with errors that name the file as the user knows it. A meta of the
    common shape is checked without pydantic (spec/meta_plain.py): the job then reaches its
    sites before the server parent loads any model."""
    path = tree / META_FILE
    if not path.exists():
        raise IntakeError("the job folder has no meta.json at its top")
    try:
        return read_meta(read_meta_bytes(path))
    except SpecError as exc:
        raise IntakeError(f"meta.json is invalid:\n{exc}") from None
