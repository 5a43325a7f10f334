"""`atoll login` / `atoll logout`: a study-scoped session saved for later commands."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import atoll_home, handle_errors, printable, save_session


@click.command("login")
@click.option("--kit", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Your admin startup kit.")
@click.option("--study", default="default", show_default=True,
              help="The study to work in; every later command is scoped to it. `default` exists "
                   "only in a project without named studies.")
@handle_errors
def login_command(kit: Path, study: str) -> None:
    """Open a session in STUDY; later commands use it until `atoll logout`."""
    from atoll.admin.session import Session

    with Session(kit) as session:
        answer = session.login(study)
    path = save_session({"kit": str(kit.resolve()), "study": answer["study"],
                         "token": answer["token"], "user": answer["user"]})
    click.echo(f"logged in as {printable(answer['user'])} ({printable(answer['role'])}) in study "
               f"{printable(answer['study'])}; session saved in {path}")


@click.command("logout")
def logout_command() -> None:
    """Forget the saved session."""
    (atoll_home() / "session.json").unlink(missing_ok=True)
    click.echo("logged out")
