"""What `atoll server start|stop` and `atoll site start|stop` share."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from atoll.cli.common import fail


def start_parent(kit: Path, role: str, detach: bool, ready_file: Path | None,
                 verbose: bool) -> None:
    """Run the `role` parent of KIT in the foreground, or detached until it is ready."""
    from atoll.parent import detach, pidfile
    from atoll.parent.run import command
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    if loaded.kind != role:
        fail(f"{kit} is a {loaded.kind} kit; `atoll {role} start` needs a {role}'s kit")
    running = pidfile.read_pid(loaded.workspace, role)
    if running:
        fail(f"the {role} parent of {kit} already runs (pid {running}); "
             f"`atoll {role} stop {kit}`")
    if detach:
        try:
            pid = detach.start_detached(role, kit, loaded.workspace)
        except RuntimeError as exc:
            fail(str(exc), 3)
        where = (f"listening on {loaded.listen_address}" if role == "server"
                 else f"dialing {loaded.server_address}")
        click.echo(f"{role} {loaded.name} started (pid {pid}), {where}; "
                   f"log: {loaded.workspace / f'{role}.log'}")
        return
    # The parent runs for months: this process becomes it (same pid, same output), without
    # the CLI's modules in memory.
    sys.stdout.flush()
    sys.stderr.flush()
    argv = command(role, kit, ready_file, verbose)
    os.execv(argv[0], argv)


def stop_parent(kit: Path, role: str) -> None:
    from atoll.parent import detach
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    if detach.stop(loaded.workspace, role):
        click.echo(f"{role} {loaded.name} stopped")
    else:
        click.echo(f"{role} {loaded.name} was not running")


def start_options(fn):
    fn = click.option("-v", "--verbose", is_flag=True, help="Log debug lines.")(fn)
    fn = click.option("--ready-file", type=click.Path(path_type=Path), hidden=True)(fn)
    fn = click.option("--detach", is_flag=True,
                      help="Run in the background; return once it is ready.")(fn)
    return click.argument("kit", type=click.Path(exists=True, file_okay=False,
                                                 path_type=Path))(fn)
