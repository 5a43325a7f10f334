"""`atoll server start|stop`."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import fail, handle_errors

kit_arg = click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))


@click.group("server")
def server_group() -> None:
    """The server parent: stores and schedules jobs, relays, never holds a GPU."""


@server_group.command("start")
@kit_arg
@click.option("--detach", is_flag=True, help="Run in the background; return once it is ready.")
@click.option("--ready-file", type=click.Path(path_type=Path), hidden=True)
@click.option("-v", "--verbose", is_flag=True, help="Log debug lines.")
@handle_errors
def start(kit: Path, detach: bool, ready_file: Path | None, verbose: bool) -> None:
    """Start the server parent of KIT (a server startup kit)."""
    from atoll import daemon
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    if loaded.kind != "server":
        fail(f"{kit} is a {loaded.kind} kit; `atoll server start` needs the server's kit")
    running = daemon.read_pid(loaded.workspace, "server")
    if running:
        fail(f"the server of {kit} already runs (pid {running}); `atoll server stop {kit}`")
    if detach:
        try:
            pid = daemon.start_detached(["server", "start", str(kit)], loaded.workspace, "server")
        except RuntimeError as exc:
            fail(str(exc), 3)
        click.echo(f"server {loaded.name} started (pid {pid}), listening on "
                   f"{loaded.listen_address}; log: {loaded.workspace / 'server.log'}")
        return
    from atoll.server.app import run_forever

    daemon.setup_logging(verbose)
    daemon.write_pid(loaded.workspace, "server")
    try:
        raise SystemExit(run_forever(loaded, ready_file))
    except OSError as exc:
        fail(f"cannot start the server: {exc}", 3)
    finally:
        daemon.pid_file(loaded.workspace, "server").unlink(missing_ok=True)


@server_group.command("stop")
@kit_arg
@handle_errors
def stop(kit: Path) -> None:
    """Stop the server parent of KIT; its job workers stop with it."""
    from atoll import daemon
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    if daemon.stop(loaded.workspace, "server"):
        click.echo(f"server {loaded.name} stopped")
    else:
        click.echo(f"server {loaded.name} was not running")
