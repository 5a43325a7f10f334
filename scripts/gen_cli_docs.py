"""Write docs/cli.md from the CLI itself, so every command is documented and stays current.

    .venv/bin/python scripts/gen_cli_docs.py          # rewrite docs/cli.md
    .venv/bin/python scripts/gen_cli_docs.py --check  # exit 1 if docs/cli.md is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from atoll.cli.main import cli
from atoll.spec.errors import EXIT_CODES

OUT = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def _walk(command: click.Command, path: list[str], ctx: click.Context):
    yield path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))


def exit_codes() -> str:
    """The one table of exit codes (atoll.spec.errors.EXIT_CODES), as Markdown."""
    rows = ["## Exit codes\n",
            "Every command, parent (`atoll server|site start`) and worker exits with one of these "
            "codes; an error's message says what to do. The table is `EXIT_CODES` in "
            "`src/atoll/spec/errors.py`, where each exception class names its code. With "
            "`--format json` a failing command prints `{\"error\": {\"code\": \"INVALID\", "
            "\"exit_code\": 2, \"message\": \"...\", \"problems\": [{\"file\", \"path\", "
            "\"message\"}, ...]}}` on stdout instead of `error: ...` on stderr (`code` is the name "
            "in this table; `problems` lists a document's problems one by one).\n",
            "| code | name | meaning |", "| ---: | --- | --- |"]
    rows += [f"| {code} | `{name}` | {meaning} |" for code, name, meaning in EXIT_CODES]
    return "\n".join(rows) + "\n"


# The environment variables the CLI reads (tests/unit/cli/test_cli_docs.py checks that every
# ATOLL_* name in src/atoll/cli and src/atoll/admin is here).
ENVIRONMENT = (
    ("ATOLL_HOME", "`~/.atoll`", "where `atoll login` saves the session (`session.json`, 0600) "
     "and, by default, `atoll poc` keeps its federation (`$ATOLL_HOME/poc`)"),
    ("ATOLL_KIT", "none", "an admin's startup kit for every command that talks to the server, "
     "instead of `--kit` or the kit of `atoll login`"),
    ("ATOLL_POC_WORKSPACE", "`$ATOLL_HOME/poc`", "where `atoll poc up|down` provision and run "
     "the local federation (`--workspace` wins)"),
)


def environment() -> str:
    rows = ["## Environment variables\n",
            "Settings of the command line; a job's workers get their own (`ATOLL_*` names are "
            "set by the launcher, see docs/site-config.md).\n",
            "| variable | default | what it sets |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {default} | {what} |" for name, default, what in ENVIRONMENT]
    return "\n".join(rows) + "\n"


def completion() -> str:
    return "\n".join([
        "## Shell completion\n",
        "`atoll` completes its commands and options in bash, zsh and fish (click's completion). "
        "Add the line for your shell to its start-up file:\n",
        "```bash",
        'eval "$(_ATOLL_COMPLETE=bash_source atoll)"     # ~/.bashrc',
        'eval "$(_ATOLL_COMPLETE=zsh_source atoll)"      # ~/.zshrc',
        "_ATOLL_COMPLETE=fish_source atoll | source      # ~/.config/fish/completions/atoll.fish",
        "```\n"])


def render() -> str:
    parts = ["# atoll command line\n",
             "Generated from the CLI by `scripts/gen_cli_docs.py`; `make test` checks it is "
             "current. Every command also answers `--help`.\n"]
    root = click.Context(cli, info_name="atoll", terminal_width=100, max_content_width=100)
    for path, command, ctx in _walk(cli, ["atoll"], root):
        title = " ".join(path)
        parts.append(f"## `{title}`\n")
        parts.append("```text\n" + command.get_help(ctx).replace("Usage: atoll", "Usage: atoll")
                     + "\n```\n")
    parts.append(exit_codes())
    parts.append(environment())
    parts.append(completion())
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/cli.md is stale: run .venv/bin/python scripts/gen_cli_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
