"""``atoll provision``: create a project's CA and startup kits, or add one participant later.

    atoll provision PROJECT.yaml --out DIR [--force]
    atoll provision add-site DIR/<project> --name NAME --org ORG
    atoll provision add-user DIR/<project> --name EMAIL --org ORG --role ROLE
    atoll provision move-server DIR/<project> --host NEW_HOST [--port PORT]

and, in ``provision_keys.py``, revocation and the flow whose keys never leave their owner:
``request``, ``sign``, ``assemble``, ``revoke``.

Errors (an invalid project.yaml, an existing folder, a duplicate name) exit with code 2 and
list every problem. Heavy imports happen inside the commands: ``atoll --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from atoll.cli.common import LazyCommands, emit, format_option, render_error
from atoll.pki.identity import ROLES

if TYPE_CHECKING:
    from atoll.pki.provision import WrittenKit

_CREATE = "create"


class _ProjectFileGroup(LazyCommands):
    """A group whose first argument may be the project file instead of a subcommand name."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in self.lazy \
                and args[0] not in ctx.help_option_names:
            args = [_CREATE, *args]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["PROJECT.yaml --out DIR [--force]", "|", "COMMAND [ARGS]..."]


def _guarded(action: Any) -> Any:
    """Run ``action``; atoll's own errors (every problem of a project.yaml listed) and a file
    that cannot be written end the command through the CLI's one renderer, exit code 2."""
    from atoll.spec.errors import AtollError

    try:
        return action()
    except AtollError as exc:
        render_error(exc)
    except OSError as exc:
        render_error(f"cannot write {exc.filename or ''}: {exc.strerror}")


def _kit_lines(kits: list[WrittenKit], base: Path, ca: bool = False) -> list[str]:
    rows = [("ca/", "ca", "the project's CA: keep it private")] if ca else []
    for kit in kits:
        folder = f"{kit.path.relative_to(base)}/"
        about = f"org {kit.org}" + (f", role {kit.role}" if kit.role else "")
        if folder != f"{kit.name}/":
            about = f"{kit.name}, {about}"
        rows.append((folder, kit.kind, about))
    width = max(len(folder) for folder, _, _ in rows)
    return [f"  {folder:<{width}}  {kind:<6}  {about}".rstrip() for folder, kind, about in rows]


class _CreateCommand(click.Command):
    """Shows its usage as the group's: ``atoll provision PROJECT.yaml --out DIR``."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        prog = ctx.parent.command_path if ctx.parent else ctx.command_path
        formatter.write_usage(prog, "PROJECT.yaml --out DIR [--force]")


_KEYS = "atoll.cli.provision_keys"


@click.group(
    "provision",
    cls=_ProjectFileGroup,
    invoke_without_command=False,
    lazy={"request": (_KEYS, "request_command"), "sign": (_KEYS, "sign_command"),
          "assemble": (_KEYS, "assemble_command"), "revoke": (_KEYS, "revoke_command")},
    help="Create a project's CA and startup kits from PROJECT.yaml, add one participant to a "
    "provisioned project, sign a participant's own request, or revoke a certificate.\n\n"
    "  atoll provision PROJECT.yaml --out DIR\n\n"
    "writes DIR/<project>/: ca/ (kept by the project admin) and one kit folder per "
    "participant. See docs/provisioning.md.",
)
def provision_group() -> None:
    pass


@provision_group.command(_CREATE, cls=_CreateCommand, hidden=True)
@click.argument("project_file", metavar="PROJECT.yaml", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write DIR/<project>/ into (created if missing).",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing DIR/<project> (new CA: resend every kit)."
)
@format_option
def create_command(project_file: Path, out_dir: Path, force: bool, fmt: str) -> None:
    """Provision every participant of PROJECT.yaml into DIR/<project>/."""
    from rich.console import Console
    from rich.markup import escape

    from atoll.parent.local_config import record_kits
    from atoll.pki.project import load_project
    from atoll.pki.provision import provision

    project = _guarded(lambda: load_project(project_file))
    result = _guarded(lambda: provision(project, out_dir, force=force))
    record_kits(result.project_dir)
    listen = project.server.listen
    if fmt == "json":
        emit({"project": project.name, "project_dir": str(result.project_dir),
              "ca": str(result.project_dir / "ca"), "kits": [kit_json(k) for k in result.kits],
              "listen": f"{listen.host}:{listen.port}",
              "server": f"{project.server.host}:{project.server.port}"}, fmt)
        return
    out = Console(highlight=False, soft_wrap=True)
    out.print(f"Provisioned [bold]{escape(project.name)}[/] in {escape(str(result.project_dir))}/")
    for line in _kit_lines(result.kits, result.project_dir, ca=True):
        out.print(escape(line))
    out.print(
        f"\nThe server listens on {escape(f'{listen.host}:{listen.port}')} and is dialled at "
        f"{escape(f'{project.server.host}:{project.server.port}')} (server/startup/kit.yaml)."
    )
    out.print(
        "Send each kit folder to its participant over a secure channel; ca/ signs new "
        "participants (`atoll provision add-site|add-user`)."
    )


@provision_group.command("add-site")
@click.argument("project_dir", metavar="DIR/PROJECT", type=click.Path(path_type=Path))
@click.option("--name", required=True, help="Site name: lowercase letters, digits and '-'.")
@click.option("--org", required=True, help="Organization the site belongs to.")
@format_option
def add_site_command(project_dir: Path, name: str, org: str, fmt: str) -> None:
    """Sign a new site with the project's CA and write only its kit."""
    from atoll.parent.local_config import record_kits
    from atoll.pki.provision import add_site

    kit = _guarded(lambda: add_site(project_dir, name, org))
    record_kits(kit.path)
    _report_added(
        kit,
        "Enrol it in a study with `atoll study add-site STUDY SITE` (before it ever connects: "
        "an admin kit of this project folder sends its certificate); the server accepts it "
        "when it connects with this certificate.",
        fmt,
    )


@provision_group.command("add-user")
@click.argument("project_dir", metavar="DIR/PROJECT", type=click.Path(path_type=Path))
@click.option("--name", required=True, help="User name: an email address.")
@click.option("--org", required=True, help="Organization the user belongs to.")
@click.option("--role", required=True, type=click.Choice(ROLES), help="The user's role.")
@format_option
def add_user_command(project_dir: Path, name: str, org: str, role: str, fmt: str) -> None:
    """Sign a new admin user with the project's CA and write only their kit."""
    from atoll.pki.provision import add_user

    kit = _guarded(lambda: add_user(project_dir, name, org, role))
    _report_added(kit, "Add the user to a study with `atoll study add-user STUDY USER`: no "
                  "need to wait for their first login (an admin kit of this project folder "
                  "sends their certificate; from elsewhere pass --cert USER/startup/client.crt).", fmt)


@provision_group.command("move-server")
@click.argument("project_dir", metavar="DIR/PROJECT", type=click.Path(path_type=Path))
@click.option("--host", required=True, help="The host name or address sites will dial.")
@click.option("--port", type=int, default=None, help="The new port (default: unchanged).")
@click.option("--also", multiple=True, metavar="NAME",
              help="Another name the certificate must hold (repeatable), e.g. the old host "
              "while sites move over.")
@format_option
def move_server_command(project_dir: Path, host: str, port: int | None, also: tuple[str, ...],
                        fmt: str) -> None:
    """Re-issue the server's certificate for a new host name, with the same CA.

    Writes the new certificate and key into DIR/PROJECT/server, points its kit.yaml (and its
    listen address, where that was the default) and every kit still in the project folder at
    the new address. No kit is sent again: each site and user edits `server:` in their own
    startup/kit.yaml, and running sites follow. docs/provisioning.md, "Moving the server".
    """
    from atoll.pki.server_move import move_server

    moved = _guarded(lambda: move_server(project_dir, host, port, also))
    new = f"{moved.new[0]}:{moved.new[1]}"
    steps = [
        f"copy {moved.server_kit}/startup/ (server.crt, server.key, kit.yaml, kit.json, "
        "project.json) to the server's kit and restart the server there",
        f"at each site and user: set `server: {{host: {moved.new[0]}, port: {moved.new[1]}}}` "
        "in startup/kit.yaml (a running site follows within seconds; nothing else changes)",
    ]
    if fmt == "json":
        emit({"server_kit": str(moved.server_kit), "old": f"{moved.old[0]}:{moved.old[1]}",
              "new": new, "listen": f"{moved.listen[0]}:{moved.listen[1]}",
              "names": list(moved.names), "serial": moved.serial,
              "kits_updated": [str(p) for p in moved.kits_updated], "next": steps}, fmt)
        return
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False, soft_wrap=True)
    out.print(f"Re-issued the server certificate (serial {moved.serial}) for "
              f"{escape(', '.join(moved.names))}; same CA, every other kit stays valid.")
    out.print(f"The server is now dialled at {escape(new)} and listens on "
              f"{escape(f'{moved.listen[0]}:{moved.listen[1]}')}.")
    if moved.kits_updated:
        names = ", ".join(p.name for p in moved.kits_updated)
        out.print(f"Kits in the project folder pointed at it: {escape(names)}.")
    out.print("Next:")
    for number, step in enumerate(steps, 1):
        out.print(f"  {number}. {escape(step)}")


def kit_json(kit: WrittenKit) -> dict[str, Any]:
    return {"name": kit.name, "kind": kit.kind, "org": kit.org, "role": kit.role,
            "path": str(kit.path)}


def _report_added(kit: WrittenKit, next_step: str, fmt: str) -> None:
    if fmt == "json":
        emit({"added": kit_json(kit), "next": next_step}, fmt)
        return
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False, soft_wrap=True)
    out.print(f"Added {kit.kind} [bold]{escape(kit.name)}[/] ({escape(kit.org)}):")
    for line in _kit_lines([kit], kit.path.parent):
        out.print(escape(line))
    out.print("No other kit was changed. " + next_step)
