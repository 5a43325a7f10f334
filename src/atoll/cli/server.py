"""`atoll server start|stop|backup|restore`."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import emit, fail, format_option, handle_errors, printable
from atoll.cli.parents import start_options, start_parent, stop_parent


@click.group("server")
def server_group() -> None:
    """The server parent: stores and schedules jobs, relays, never holds a GPU."""


@server_group.command("start")
@start_options
@handle_errors
def start(kit: Path, detach: bool, ready_file: Path | None, verbose: bool, fmt: str) -> None:
    """Start the server parent of KIT (a server startup kit)."""
    start_parent(kit, "server", detach, ready_file, verbose, fmt)


@server_group.command("stop")
@click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))
@format_option
@handle_errors
def stop(kit: Path, fmt: str) -> None:
    """Stop the server parent of KIT; its job workers stop with it."""
    stop_parent(kit, "server", fmt)


@server_group.command("backup")
@click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@format_option
@handle_errors
def backup(kit: Path, out: Path, fmt: str) -> None:
    """Copy the state of KIT's server into the new folder OUT, while it runs or not.

    OUT holds the job store (SQLite's online backup of atoll.db), session.key, crl.pem and the
    job folders; it is private (0700) and holds secrets: keep it as you keep the kit."""
    from atoll.pki.kit import load_kit
    from atoll.server.backup import backup as take

    loaded = load_kit(kit)
    if loaded.kind != "server":
        fail(f"{kit} is a {loaded.kind} kit; `atoll server backup` needs the server's kit")
    copied = take(loaded.workspace, out)
    skipped = f"; {copied.skipped} links or special files skipped" if copied.skipped else ""
    emit(copied.summary(), fmt,
         f"backed up {printable(loaded.name)} into {printable(out)}: {copied.files} files, "
         f"{copied.bytes:,} bytes{skipped}")


@server_group.command("restore")
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))
@format_option
@handle_errors
def restore(source: Path, kit: Path, fmt: str) -> None:
    """Put the backup SOURCE into KIT, a server kit whose server is stopped and whose
    workspace holds no job store yet; then `atoll server start KIT`."""
    from atoll.parent import pidfile
    from atoll.pki.kit import load_kit
    from atoll.server.backup import restore as put

    loaded = load_kit(kit)
    if loaded.kind != "server":
        fail(f"{kit} is a {loaded.kind} kit; `atoll server restore` needs the server's kit")
    running = pidfile.read_pid(loaded.workspace, "server")
    if running:
        fail(f"the server of {kit} runs (pid {running}): `atoll server stop {kit}` first")
    copied = put(source, loaded.workspace)
    emit(copied.summary(), fmt,
         f"restored {printable(source)} into {printable(loaded.workspace)}: {copied.files} "
         f"files, {copied.bytes:,} bytes; start it with `atoll server start {printable(kit)}`")
