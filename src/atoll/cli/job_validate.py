"""``atoll job validate JOB_DIR``, and the same check at the start of ``job submit``: every
problem of the job folder, named by the user's own paths, before anything runs
(atoll/fl/job_folder_check.py does the checking)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click

from atoll.cli.common import (
    emit,
    format_option,
    handle_errors,
    kit_option,
    open_session,
    printable,
    render_error,
    saved_session,
    study_option,
)

set_option = click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE",
    help="Override an app.yaml argument for this run: a workflow argument (num_rounds=3, or "
         "server.args.num_rounds=3) or a site setting (site.config.batch_size=64); repeatable.")


def study_sites(session, study: str | None) -> tuple[str, list[str]]:
    """The study a command acts in and its sites, as the server knows them."""
    answer = session.sites(study)
    return answer["study"], [site["name"] for site in answer["sites"]]


def check_or_fail(job_dir: Path, sets: tuple[str, ...], study: str | None = None,
                  sites: list[str] | None = None) -> dict:
    """The job's overrides, once the job passed every check; otherwise every problem is
    printed (once each) and the command exits 2."""
    from atoll.fl.job_folder_check import check_job, parse_overrides
    from atoll.spec.errors import SpecError

    try:
        overrides = parse_overrides(sets)
    except SpecError as exc:
        render_error(exc)
    problems = check_job(job_dir, study, sites, overrides)
    if problems:
        render_error(problems)
    return overrides


@contextlib.contextmanager
def job_to_run(job_dir: Path, overrides: dict) -> Iterator[Path]:
    """The folder to submit or simulate: ``job_dir`` itself, or a copy carrying --set."""
    if not overrides:
        yield job_dir
        return
    from atoll.fl.job_folder_check import copy_with_overrides

    with tempfile.TemporaryDirectory(prefix="atoll-job-") as tmp:
        yield copy_with_overrides(job_dir, Path(tmp) / job_dir.resolve().name, overrides)


@click.command("validate")
@click.argument("job_dir", type=click.Path(file_okay=False, path_type=Path))
@kit_option
@study_option
@set_option
@format_option
@handle_errors
def validate_command(job_dir: Path, kit: Path | None, study: str | None, sets: tuple[str, ...],
                     fmt: str) -> None:
    """Check JOB_DIR as `job submit` does, without submitting it.

    meta.json, every app's app.yaml (workflow and its arguments), the scripts and modules it
    names (they exist and compile), and, when you are logged in or pass --kit, min_clients
    and the sites of deploy_map against the study's sites. Exits 2 listing every problem."""
    import os

    sites, where = None, None
    if kit is not None or os.environ.get("ATOLL_KIT") or saved_session().get("kit"):
        with open_session(kit) as session:
            where, sites = study_sites(session, study)
    check_or_fail(job_dir, sets, where, sites)
    against = (f"; checked against study {printable(where)} ({len(sites)} site(s))"
               if sites is not None else "; not checked against a study's sites (no admin kit: "
               "pass --kit or run `atoll login`)")
    emit({"ok": True, "job_dir": str(job_dir), "study": where, "sites": sites}, fmt,
         f"{printable(job_dir)}: ok{against}")
