"""``atoll job import-flare FLARE_JOB_DIR OUT_DIR``: an NVIDIA FLARE 2.9 job as an atoll job."""

from __future__ import annotations

import json
from pathlib import Path

import click

from atoll.cli.common import format_option, handle_errors


@click.command("import-flare")
@click.argument("flare_job_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--column", "columns", multiple=True, metavar="DATASET/FEATURE",
              help="A statistics job (FLARE's FedStatsRecipe): a column to ask about, the "
                   "generator's dataset and feature (repeat: --column train/Age --column "
                   "test/Age). FLARE's export names none.")
@format_option
@handle_errors
def import_flare_command(flare_job_dir: Path, out_dir: Path, columns: tuple[str, ...],
                         fmt: str) -> None:
    """Translate a FLARE job folder (FedAvg recipe, Client API script) into OUT_DIR.

    Reads meta.json, each app's config_fed_server.json / config_fed_client.json and custom/
    folder; points the scripts' Client API import lines (nvflare.client, its tracking writers,
    NPConstants, FLModel, the Lightning and Hugging Face hooks, a statistics generator's base
    classes) at atoll.compat; lists everything it could not translate. A statistics job
    (FedStatsRecipe) becomes atoll's statistics workflow over the --column columns. Exits 2
    when the job cannot be translated.
    """
    from atoll.compat.flare_job import import_flare_job

    report = import_flare_job(flare_job_dir, out_dir, list(columns))
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "out_dir": str(report.out_dir), "files": report.files,
                               "rewritten": report.rewritten,
                               "not_translated": report.not_translated}, indent=2))
        return
    click.echo(f"wrote {report.out_dir}/: " + ", ".join(report.files))
    for line in report.rewritten:
        click.echo(f"import line changed: {line}")
    if report.not_translated:
        click.echo(f"not translated ({len(report.not_translated)}):")
        for line in report.not_translated:
            click.echo(f"  - {line}")
    else:
        click.echo("everything was translated")
    click.echo(f"submit it: atoll job submit {report.out_dir} --kit ADMIN_KIT")
