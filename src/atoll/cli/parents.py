"""What `atoll server start|stop` and `atoll site start|stop` share."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from atoll.cli.common import emit, fail, format_option, printable


def start_parent(kit: Path, role: str, detach: bool, ready_file: Path | None,
                 verbose: bool, fmt: str = "text") -> None:
    """Run the `role` parent of KIT in the foreground, or detached until it is ready (then its
    pid, address and log are the command's result; in the foreground the parent's own log
    lines are its output)."""
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
        address = loaded.listen_address if role == "server" else loaded.server_address
        where = f"listening on {address}" if role == "server" else f"dialing {address}"
        log = loaded.workspace / f"{role}.log"
        emit({"role": role, "name": loaded.name, "pid": pid, "address": str(address),
              "log": str(log)}, fmt,
             f"{role} {printable(loaded.name)} started (pid {pid}), {printable(where)}; "
             f"log: {printable(log)}")
        return
    # The parent runs for months: this process becomes it (same pid, same output), without
    # the CLI's modules in memory.
    sys.stdout.flush()
    sys.stderr.flush()
    argv = command(role, kit, ready_file, verbose)
    os.execv(argv[0], argv)


def stop_parent(kit: Path, role: str, fmt: str = "text") -> None:
    from atoll.parent import detach
    from atoll.pki.kit import load_kit

    loaded = load_kit(kit)
    stopped = detach.stop(loaded.workspace, role)
    emit({"role": role, "name": loaded.name, "stopped": stopped}, fmt,
         f"{role} {printable(loaded.name)} {'stopped' if stopped else 'was not running'}")


def start_options(fn):
    fn = format_option(fn)
    fn = click.option("-v", "--verbose", is_flag=True, help="Log debug lines.")(fn)
    fn = click.option("--ready-file", type=click.Path(path_type=Path), hidden=True)(fn)
    fn = click.option("--detach", is_flag=True,
                      help="Run in the background; return once it is ready.")(fn)
    return click.argument("kit", type=click.Path(exists=True, file_okay=False,
                                                 path_type=Path))(fn)
