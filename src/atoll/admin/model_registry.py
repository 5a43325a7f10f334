"""A job's released model in MLflow's model registry, with its verified provenance.

`atoll provenance register` first verifies the record offline (pki/provenance.py: the CA, every
entry, the server's signed head) and that the model file is the record's final model; only then
does it write to MLflow: the model file and the record as artifacts of the job's own MLflow run
(the one the server worker tracked, found by its ``atoll.job_id`` tag; a run of its own where
the job was not tracked), and a new version of the registered model, created from that run,
whose tags are the record's digests (TAGS). So a version's tags are never more than what a
record that verifies states.

Why here, in the admin's client, and not at the job's end: the record is complete (its final
entry, its signed head) only once the job has ended, and the server parent must not connect to a
tracking server the job's own app.yaml chose; the study's lead registers with their own MLflow
credentials (MLflow's environment variables, e.g. ``MLFLOW_TRACKING_TOKEN``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from atoll.spec.errors import EXIT_CONNECTION, AtollError

ARTIFACTS = "atoll"  # the run's artifact folder for the model and the record
RECORD_NAME = "provenance.json"
TAG_LIMIT = 5000  # MLflow's longest tag value


class RegistryError(AtollError):
    """MLflow could not be reached or refused the registration (or is not installed)."""

    exit_code = EXIT_CONNECTION


def record_tags(data: bytes, verified: Any) -> dict[str, str]:
    """The version's tags: what the verified record states about the job and its model."""
    signed = next((e.body for e in verified.entries if e.kind == "job.signed"), {})
    intake = next((e.body for e in verified.entries if e.kind == "server.intake"), {})
    final = next((e.body for e in verified.entries if e.kind == "job.final"), {})
    # round -> its digest: a round stated again (re-run after a resume) is its later statement's
    rounds: dict[Any, Any] = {}
    for body in (e.body for e in verified.entries if e.kind == "round.model"):
        rounds[body.get("round")] = body.get("digest")
    sites = sorted({e.by_name for e in verified.entries if e.kind == "site.launch"})
    tags = {
        "atoll.job_id": verified.job_id,
        "atoll.record_digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "atoll.record_head": verified.entries[-1].digest if verified.entries else "",
        "atoll.record_entries": str(len(verified.entries)),
        "atoll.content_digest": str(signed.get("content_digest", "")),
        "atoll.statement_digest": str(signed.get("statement_digest", "")),
        "atoll.study": str(intake.get("study", "")),
        "atoll.submitted_by": str(intake.get("submitted_by", "")),
        "atoll.state": str(final.get("state", "")),
        "atoll.model_digest": str(final.get("model_digest", "")),
        "atoll.metrics_digest": str(final.get("metrics_digest", "")),
        "atoll.sites": ",".join(sites),
        "atoll.rounds": str(len(rounds)),
    }
    numbered = [r for r in rounds if isinstance(r, int)]
    if numbered:
        tags["atoll.last_round_digest"] = str(rounds[max(numbered)] or "")
    if "dp_epsilon" in final:
        tags["atoll.dp_epsilon"] = str(final["dp_epsilon"])
    for entry in verified.entries:  # each site's image digest, as that site signed it
        if entry.kind == "site.launch":
            digest = entry.body.get("image_id") or entry.body.get("image_digest")
            if digest:
                tags[f"atoll.image_digest.{entry.by_name}"] = str(digest)
    return {k: v[:TAG_LIMIT] for k, v in tags.items() if v}


def register(data: bytes, verified: Any, model: Path, tracking_uri: str,
             name: str | None) -> dict[str, Any]:
    """Register ``model`` (already checked against the verified record) as a new version."""
    import os

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise RegistryError("registering needs the mlflow package: pip install "
                            "'atoll[tracking]'") from None
    tags = record_tags(data, verified)
    try:
        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        run = _job_run(client, verified.job_id)
        if run is None:  # the job was not tracked: a run of its own carries the artifacts
            experiment = client.get_experiment_by_name("atoll")
            experiment_id = (experiment.experiment_id if experiment is not None
                             else client.create_experiment("atoll"))
            run = client.create_run(experiment_id, run_name=f"{verified.job_id} (registered)",
                                    tags={"atoll.job_id": verified.job_id})
            client.set_terminated(run.info.run_id)
        name = name or run.data.tags.get("atoll.job") or "atoll-model"
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / ARTIFACTS
            folder.mkdir()
            shutil.copyfile(model, folder / model.name)
            (folder / RECORD_NAME).write_bytes(data)
            client.log_artifacts(run.info.run_id, str(folder), ARTIFACTS)
        if client.search_registered_models(f"name = '{_quoted(name)}'") == []:
            client.create_registered_model(name, tags={"atoll.study": tags.get("atoll.study",
                                                                                "")})
        version = client.create_model_version(
            name, f"{run.info.artifact_uri}/{ARTIFACTS}/{model.name}", run_id=run.info.run_id,
            tags=tags, description=f"atoll job {verified.job_id}: its provenance record "
            f"({ARTIFACTS}/{RECORD_NAME} in run {run.info.run_id}) verified")
    except RegistryError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow's errors: unreachable, refused, ...
        raise RegistryError(f"MLflow at {tracking_uri} did not register the model: "
                            f"{str(exc)[:500]}") from None
    return {"name": name, "version": str(version.version), "run_id": run.info.run_id,
            "tags": tags}


def _job_run(client: Any, job_id: str) -> Any | None:
    """The job's own top-level run (the server worker's), by its atoll.job_id tag: not a site's
    nested run, nor the run a site's worker keeps in its operator's experiment (atoll.site)."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return None
    runs = client.search_runs(experiments, f"tags.`atoll.job_id` = '{_quoted(job_id)}'")
    top = [r for r in runs if "mlflow.parentRunId" not in r.data.tags
           and "atoll.site" not in r.data.tags]
    return top[0] if top else None


def _quoted(value: str) -> str:
    if "'" in value or "\\" in value:
        raise RegistryError(f"{json.dumps(value)} cannot be searched for in MLflow")
    return value
