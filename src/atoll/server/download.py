"""A job's results for ``atoll job download``: who may have them, and the zip streamed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.pki.provenance import ProvenanceError
from atoll.server.job_ops import find_job, require_manager
from atoll.server.jobs import job_summary
from atoll.wire import frames

if TYPE_CHECKING:
    from atoll.pki.identity import Identity
    from atoll.server.job_ops import JobOps
    from atoll.server.store import JobRecord

log = logging.getLogger("atoll.server.download")

def authorize(deps: JobOps, who: Identity, study: str, body: dict[str, Any]) -> JobRecord:
    """The job to download: ``who`` is in ``study``, the job in it, and ``who`` may manage it
    where its sites allow ``download_job``; NoSuchJob or Denied otherwise."""
    deps.studies.require_member(who, study)
    record = find_job(deps, study, body.get("job_id"))
    require_manager(deps, who, record, "download_job", "download")
    return record


def results_frames(deps: JobOps, record: JobRecord, scratch: Path) -> Iterator[Any]:
    """The header (job id, size) and the chunks of the job's results zip, built in
    ``scratch`` and gone once streamed."""
    import tempfile  # with zipfile: when results are fetched, not in a parent at rest

    from atoll.server.results_zip import write_results_zip

    folder = deps.jobs.jobs_dir / record.id
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        extra = {}
        provenance = getattr(deps.jobs, "provenance", None)
        if provenance is not None:  # the record, its head signed now (server/provenance.py)
            try:
                extra["provenance.json"] = provenance.export(record.id)
            except ProvenanceError as exc:
                log.warning("job %s: no provenance record in its download: %s", record.id, exc)
        out = write_results_zip(folder, Path(tmp) / "results.zip", job_summary(record), extra)
        yield frames.header({"job_id": record.id, "size": out.stat().st_size})
        for chunk in frames.file_chunks(out):
            yield frames.data(chunk)
