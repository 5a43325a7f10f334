"""`atoll server start|stop`."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import format_option, handle_errors
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
