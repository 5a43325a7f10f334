"""What every CLI command shares: finding the kit and session, errors (the one renderer,
``render_error``), and output."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

SESSION_FILE = "session.json"


def atoll_home() -> Path:
    return Path(os.environ.get("ATOLL_HOME", Path.home() / ".atoll"))


def saved_session() -> dict[str, Any]:
    path = atoll_home() / SESSION_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_session(data: dict[str, Any]) -> Path:
    home = atoll_home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / SESSION_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return path


class LazyCommands(click.Group):
    """A group some of whose commands live in modules imported only when that command runs
    (or for --help), so that the group's other commands do not pay for them."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}  # name -> (module, attribute)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, attr = self.lazy[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)


def printable(value: object, lines: bool = False) -> str:
    """Text that came from other people (job names, reasons, study and user names, server
    messages) made safe to print: every control or invisible formatting character (a terminal
    escape, a carriage return, a bidi override; a newline or tab too unless ``lines``) is shown
    as its Python escape, e.g. ``\\x1b[2J``, so it can neither drive the terminal nor forge
    a table row. Every text output of the CLI goes through it; ``--format json`` is escaped by
    JSON itself."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or (lines and ch in "\n\t") else ascii(ch)[1:-1]
                   for ch in text)


def log_text(text: str) -> str:
    """A job's log as printed: the job's own output, kept byte for byte when stdout is a file
    or a pipe, escaped like ``printable`` (lines kept) on a terminal."""
    return printable(text, lines=True) if sys.stdout.isatty() else text


Problem = dict[str, str]  # {"file", "path", "message"}: one line of an error's list


def error_problems(error: BaseException, file: str = "") -> list[Problem]:
    """``error`` as the problems it reports: a SpecError's issues (each with its file and path,
    ``file`` when the error names none), else its message."""
    from atoll.spec.errors import SpecError

    if isinstance(error, SpecError):
        return [{"file": error.source or file, "path": i.path, "message": i.message}
                for i in error.issues]
    return [{"file": file, "path": "", "message": str(error)}]


def render_error(error: BaseException | str | list[Problem], fmt: str | None = None,
                 code: int | None = None) -> NoReturn:
    """The CLI's one error renderer: print ``error`` and exit with its code.

    ``error`` is an exception (an AtollError exits with its ``exit_code``; a SpecError lists
    every issue under its file), a message, or a list of problems from several files. With
    ``--format json`` (``fmt``, by default the running command's own --format) stdout gets
    ``{"error": {"code": "INVALID", "exit_code": 2, "message": ..., "problems": [{"file",
    "path", "message"}...]}}`` (``code`` is the exit code's name in ``EXIT_CODES``); otherwise
    stderr gets ``error: <message>``, or ``error: <what>: N problems`` and one
    ``  - <problem>`` line each.
    """
    from atoll.spec.errors import (
        EXIT_CODES,
        EXIT_INTERRUPTED,
        EXIT_INVALID,
        AtollError,
        SpecError,
    )

    if code is None:
        code = (error.exit_code if isinstance(error, AtollError)
                else EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else EXIT_INVALID)
    if isinstance(error, KeyboardInterrupt):
        error = "interrupted"
    title, problems, named = str(error), None, None
    if isinstance(error, list):  # from several files: each line names its file
        title, problems = "", error
    elif isinstance(error, SpecError):  # one document: the title names it
        title, problems = error.source or "", error_problems(error)
        named = error.source or ""
    if problems is not None:
        count = len(problems)
        title = f"{title + ': ' if title else ''}{count} problem{'s' if count != 1 else ''}"
        lines = [": ".join(x for x in (p["file"] if p["file"] != named else "",
                                       p["path"], p["message"]) if x) for p in problems]
        text = "\n".join([title, *(f"  - {line}" for line in lines)])
    else:
        text = title
    if (fmt or _command_format()) == "json":
        name = next((n for c, n, _ in EXIT_CODES if c == code), "FAILED")
        body: dict[str, Any] = {"code": name, "exit_code": code, "message": text}
        if problems is not None:
            body["problems"] = problems
        click.echo(json.dumps({"error": body}, indent=2))
        sys.exit(code)
    title = text
    click.secho(f"error: {printable(title, lines=True)}", fg="red", err=True)
    sys.exit(code)


def _command_format() -> str:
    """The --format of the command that runs (``fmt``), text when it has none."""
    ctx = click.get_current_context(silent=True)
    return str(ctx.params.get("fmt") or "text") if ctx is not None else "text"


def fail(message: str, code: int = 2) -> NoReturn:
    """``render_error`` for a message of the CLI's own (exit 2: invalid input, by default)."""
    render_error(message, code=code)


def handle_errors(fn):
    """Every AtollError (and Ctrl-C) that ends a command is rendered by ``render_error``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from atoll.spec.errors import AtollError

        try:
            return fn(*args, **kwargs)
        except (AtollError, KeyboardInterrupt) as exc:
            render_error(exc)

    return wrapper


kit_option = click.option(
    "--kit", "kit", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="An admin's startup kit (default: $ATOLL_KIT, or the kit of `atoll login`).")
study_option = click.option(
    "--study", default=None, help="Run this one command in another study (one-off).")
format_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="json keeps stdout machine-readable.")


def open_session(kit: Path | None, study: str | None = None):
    from atoll.admin.session import Session

    saved = saved_session()
    kit = kit or (Path(os.environ["ATOLL_KIT"]) if os.environ.get("ATOLL_KIT") else None)
    token = None
    if kit is None and saved.get("kit"):
        kit = Path(saved["kit"])
    if kit is None:
        fail("no admin kit: pass --kit KIT, set ATOLL_KIT, or run `atoll login --kit KIT`")
    if saved.get("kit") and Path(saved["kit"]).resolve() == kit.resolve():
        token = saved.get("token")
    session = Session(kit, token=token)
    session.study = saved.get("study") if token else None
    return session


def emit(data: Any, fmt: str, text: str | None = None) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    elif text is not None:
        click.echo(text)
