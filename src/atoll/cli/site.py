"""`atoll site start|stop|list|render|validate`."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import (
    emit,
    fail,
    format_option,
    handle_errors,
    kit_option,
    open_session,
    study_option,
)

kit_arg = click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))


@click.group("site")
def site_group() -> None:
    """A site parent: dials the server, starts this site's job workers through its launcher."""


@site_group.command("start")
@kit_arg
@click.option("--detach", is_flag=True, help="Run in the background; return once it is ready.")
@click.option("--ready-file", type=click.Path(path_type=Path), hidden=True)
@click.option("-v", "--verbose", is_flag=True, help="Log debug lines.")
@handle_errors
def start(kit: Path, detach: bool, ready_file: Path | None, verbose: bool) -> None:
    """Start the site parent of KIT (a site startup kit)."""
    from atoll import daemon
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    if loaded.kind != "site":
        fail(f"{kit} is a {loaded.kind} kit; `atoll site start` needs a site's kit")
    running = daemon.read_pid(loaded.workspace, "site")
    if running:
        fail(f"site {loaded.name} already runs (pid {running}); `atoll site stop {kit}`")
    if detach:
        try:
            pid = daemon.start_detached(["site", "start", str(kit)], loaded.workspace, "site")
        except RuntimeError as exc:
            fail(str(exc), 3)
        click.echo(f"site {loaded.name} started (pid {pid}), dialing {loaded.server_address}; "
                   f"log: {loaded.workspace / 'site.log'}")
        return
    from atoll.site.app import run_forever

    daemon.setup_logging(verbose)
    daemon.write_pid(loaded.workspace, "site")
    try:
        raise SystemExit(run_forever(loaded, ready_file))
    finally:
        daemon.pid_file(loaded.workspace, "site").unlink(missing_ok=True)


@site_group.command("stop")
@kit_arg
@handle_errors
def stop(kit: Path) -> None:
    """Stop the site parent of KIT; its job workers stop with it."""
    from atoll import daemon
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    if daemon.stop(loaded.workspace, "site"):
        click.echo(f"site {loaded.name} stopped")
    else:
        click.echo(f"site {loaded.name} was not running")


@site_group.command("list")
@kit_option
@study_option
@format_option
@handle_errors
def list_sites(kit: Path | None, study: str | None, fmt: str) -> None:
    """The sites enrolled in the session's study, and whether they are online."""
    with open_session(kit) as session:
        answer = session.sites(study)
    lines = [f"study {answer['study']}:"]
    for site in answer["sites"]:
        state = "online " if site["online"] else "offline"
        extra = f"  {site['launcher']}  running {site['running_jobs']}" if site["online"] else ""
        lines.append(f"  {site['name']:<24} {state}{extra}")
    emit(answer, fmt, "\n".join(lines))


def _mount_contract_commands() -> None:
    try:
        from atoll.cli.site_render import render_command, validate_command
    except ImportError:
        return
    site_group.add_command(render_command, "render")
    site_group.add_command(validate_command, "validate")


_mount_contract_commands()
