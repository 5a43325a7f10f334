"""`atoll login` / `atoll logout`: a study-scoped session saved for later commands."""

from __future__ import annotations

from pathlib import Path

import click

from atoll.cli.common import atoll_home, emit, format_option, handle_errors, printable, save_session


@click.command("login")
@click.option("--kit", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Your admin startup kit.")
@click.option("--study", default="default", show_default=True,
              help="The study to work in; every later command is scoped to it. `default` exists "
                   "only in a project without named studies.")
@format_option
@handle_errors
def login_command(kit: Path, study: str, fmt: str) -> None:
    """Open a session in STUDY; later commands use it until `atoll logout`."""
    from atoll.admin.session import Session

    with Session(kit) as session:
        answer = session.login(study)
    if server := answer.get("server_version"):
        from atoll import __version__
        from atoll.spec.versions import version_refusal

        if why := version_refusal(__version__, str(server), who="CLI"):
            click.echo(f"warning: {printable(why)}", err=True)
    path = save_session({"kit": str(kit.resolve()), "study": answer["study"],
                         "token": answer["token"], "user": answer["user"]})
    emit({"user": answer["user"], "role": answer["role"], "study": answer["study"],
          "session_file": str(path)}, fmt,
         f"logged in as {printable(answer['user'])} ({printable(answer['role'])}) in study "
         f"{printable(answer['study'])}; session saved in {printable(path)}")


@click.command("logout")
@format_option
def logout_command(fmt: str) -> None:
    """Forget the saved session."""
    path = atoll_home() / "session.json"
    had = path.exists()
    path.unlink(missing_ok=True)
    emit({"logged_out": had}, fmt, "logged out" if had else "no session to forget")
