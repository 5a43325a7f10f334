"""`atoll provenance verify`: check a job's exported provenance record offline, against the
project's root CA certificate alone (and a model file). Needs no kit and no server."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import emit, format_option, handle_errors, printable

_file = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group("provenance")
def provenance_group() -> None:
    """Verify a job's provenance record; register its model in MLflow (docs/provenance.md)."""


@provenance_group.command("verify")
@click.argument("record", type=_file)
@click.option("--ca", "ca", type=_file, required=True,
              help="The project's root CA certificate (rootCA.pem, in every startup kit).")
@click.option("--model", "model", type=_file, default=None,
              help="A model file (e.g. global_model_final.safetensors): its digest must be the "
                   "final model's in the record.")
@format_option
@handle_errors
def verify_command(record: Path, ca: Path, model: Path | None, fmt: str) -> None:
    """Check RECORD (from `atoll job provenance` or `job download`): every certificate issued by
    the CA, every entry linked to the one before and signed by the party it names, the
    submitter's job signature, the server's signed head, and the model file. Exits 2 naming
    the first entry that fails."""
    from atoll.pki.provenance import MAX_RECORD_BYTES, ProvenanceError, file_digest, verify

    with open(record, "rb") as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ProvenanceError(f"{record} is over {MAX_RECORD_BYTES:,} bytes: not a record")
    verified = verify(data, ca.read_bytes(), file_digest(model) if model else None)
    rows = [{"seq": e.seq, "kind": e.kind, "by": f"{e.by_kind} {e.by_name}", "at": e.at,
             "digest": e.digest} for e in verified.entries]
    lines = [f"provenance of job {printable(verified.job_id)}: {len(rows)} entries verify "
             f"against {ca.name}"]
    lines += [f"  {e.seq:>3}  {printable(e.kind):<14} {printable(e.by_kind)} "
              f"{printable(e.by_name)}" for e in verified.entries]
    if model is not None:
        lines.append(f"model {printable(model.name)} is the final model ({verified.model_digest})")
    emit({"job_id": verified.job_id, "verified": True, "entries": rows,
          "model_digest": verified.model_digest, "model_checked": model is not None},
         fmt, "\n".join(lines))


@provenance_group.command("register")
@click.argument("record", type=_file)
@click.option("--ca", "ca", type=_file, required=True,
              help="The project's root CA certificate (rootCA.pem, in every startup kit).")
@click.option("--model", "model", type=_file, required=True,
              help="The job's final model file (global_model_final.safetensors): it must be the "
                   "record's final model.")
@click.option("--tracking-uri", "tracking_uri", required=True, envvar="MLFLOW_TRACKING_URI",
              help="The MLflow server (default: $MLFLOW_TRACKING_URI); its credentials come "
                   "from MLflow's own environment variables.")
@click.option("--name", "name", default=None,
              help="The registered model's name (default: the job's name, as its MLflow run "
                   "has it).")
@format_option
@handle_errors
def register_command(record: Path, ca: Path, model: Path, tracking_uri: str, name: str | None,
                     fmt: str) -> None:
    """Verify RECORD and MODEL as `verify` does, then register MODEL in MLflow's model registry:
    a new version, created from the job's MLflow run (where the job was tracked), tagged with
    the record's digests, with the model and the record as the run's artifacts."""
    from atoll.admin.model_registry import register
    from atoll.pki.provenance import MAX_RECORD_BYTES, ProvenanceError, file_digest, verify

    with open(record, "rb") as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ProvenanceError(f"{record} is over {MAX_RECORD_BYTES:,} bytes: not a record")
    verified = verify(data, ca.read_bytes(), file_digest(model))
    if verified.model_digest is None:
        raise ProvenanceError("the record names no final model (the job did not end with one)")
    done = register(data, verified, model, tracking_uri, name)
    emit(done, fmt, f"registered {printable(done['name'])} version "
         f"{printable(done['version'])} (job {printable(verified.job_id)}, model "
         f"{printable(verified.model_digest)}) in run {printable(done['run_id'])}")
