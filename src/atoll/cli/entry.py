"""The `atoll` command's entry point.

`atoll server start KIT` and `atoll site start KIT` in the foreground go straight to the
parent's own entry (atoll/parent/run.py) in this process, without loading the CLI: the parent
would otherwise start twice (click, then an exec of itself without click). Any other form of
those commands, and every other command, goes to the CLI (atoll/cli/main.py), which checks and
explains bad arguments.
"""

from __future__ import annotations

import os
import sys

_FLAGS = {"-v": "--verbose", "--verbose": "--verbose"}


def parent_argv(argv: list[str]) -> list[str] | None:
    """parent/run.py's arguments for a plain foreground `server|site start KIT`, else None."""
    if len(argv) < 3 or argv[0] not in ("server", "site") or argv[1] != "start":
        return None
    out, kit, rest = [argv[0]], None, argv[2:]
    while rest:
        arg = rest.pop(0)
        if arg in _FLAGS:
            out.append(_FLAGS[arg])
        elif arg == "--ready-file" and rest:
            out += [arg, rest.pop(0)]
        elif not arg.startswith("-") and kit is None:
            kit = arg
        else:  # --detach, --help, anything unusual: the CLI handles it
            return None
    if kit is None or not os.path.isdir(kit):
        return None  # the CLI says what is wrong with it
    return [out[0], kit, *out[1:]]


def main() -> None:
    argv = parent_argv(sys.argv[1:])
    if argv is not None:
        from atoll.parent.run import main as run_parent

        run_parent(argv)  # does not return
    from atoll.cli.main import main as cli_main

    cli_main()
