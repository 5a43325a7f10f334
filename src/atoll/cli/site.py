"""`atoll site start|stop|list|render|validate|approve`."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import (
    LazyCommands,
    emit,
    format_option,
    handle_errors,
    kit_option,
    open_session,
    printable,
    study_option,
)
from atoll.cli.parents import start_options, start_parent, stop_parent

kit_arg = click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))


@click.group("site", cls=LazyCommands, lazy={
    "render": ("atoll.cli.site_render", "render_command"),
    "validate": ("atoll.cli.site_render", "validate_command"),
    "approve": ("atoll.cli.site_policy", "approve_command"),
    "jobs": ("atoll.cli.site_jobs", "jobs_command")})
def site_group() -> None:
    """A site parent: dials the server, starts this site's job workers through its launcher."""


@site_group.command("start")
@start_options
@handle_errors
def start(kit: Path, detach: bool, ready_file: Path | None, verbose: bool, fmt: str) -> None:
    """Start the site parent of KIT (a site startup kit)."""
    start_parent(kit, "site", detach, ready_file, verbose, fmt)


@site_group.command("stop")
@kit_arg
@format_option
@handle_errors
def stop(kit: Path, fmt: str) -> None:
    """Stop the site parent of KIT; its job workers stop with it."""
    stop_parent(kit, "site", fmt)


@site_group.command("list")
@kit_option
@study_option
@format_option
@handle_errors
def list_sites(kit: Path | None, study: str | None, fmt: str) -> None:
    """The sites enrolled in the session's study, and whether they are online."""
    with open_session(kit) as session:
        answer = session.sites(study)
    lines = [f"study {printable(answer['study'])}:"]
    for site in answer["sites"]:  # the launcher and job count are what the site says
        state = "online " if site["online"] else "offline"
        extra = (f"  {printable(site['launcher'])}  running {printable(site['running_jobs'])}"
                 if site["online"] else "")
        lines.append(f"  {printable(site['name']):<24} {state}{extra}")
    emit(answer, fmt, "\n".join(lines))
