"""`atoll study ...` and `atoll audit`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from atoll.cli.common import (
    emit,
    format_option,
    handle_errors,
    kit_option,
    open_session,
    printable,
)


@click.group("study")
def study_group() -> None:
    """Studies: which sites and users work together inside this federation."""


def _text(study: dict[str, Any]) -> str:
    return (f"study {printable(study['name'])}: {printable(study['jobs'])} job(s)\n"
            f"  sites: {printable(', '.join(study['sites'])) or '-'}\n"
            f"  users: {printable(', '.join(study['users'])) or '-'}")


def _run(kit: Path | None, fmt: str, op: str, **body: Any) -> None:
    with open_session(kit) as session:
        answer = session.call(op, **body)
    if "studies" in answer:
        text = "\n".join(_text(s) for s in answer["studies"])
    elif "removed" in answer:
        text = f"study {printable(answer['removed'])} removed"
    else:
        text = _text(answer)
    if answer.get("note"):  # e.g. what creating the first study did to `default`
        text += f"\nnote: {printable(answer['note'])}"
    emit(answer, fmt, text)


@study_group.command("list")
@kit_option
@format_option
@handle_errors
def list_(kit, fmt):
    """The studies you can see."""
    _run(kit, fmt, "study_list")


@study_group.command("show")
@click.argument("name")
@kit_option
@format_option
@handle_errors
def show(name, kit, fmt):
    """A study's sites, users and number of jobs."""
    _run(kit, fmt, "study_show", name=name)


@study_group.command("create")
@click.argument("name")
@click.option("--site", "sites", multiple=True, help="Enrol this site (repeat).")
@click.option("--user", "users", multiple=True, help="Add this admin user (repeat).")
@kit_option
@format_option
@handle_errors
def create(name, sites, users, kit, fmt):
    """Create study NAME (project admins)."""
    _run(kit, fmt, "study_create", name=name, sites=list(sites), users=list(users))


@study_group.command("remove")
@click.argument("name")
@kit_option
@format_option
@handle_errors
def remove(name, kit, fmt):
    """Remove study NAME (project admins); refused while it has jobs: `atoll job delete`
    them first."""
    _run(kit, fmt, "study_remove", name=name)


def _member_command(op: str, key: str, doc: str):
    @click.argument("name")
    @click.argument(key)
    @kit_option
    @format_option
    @handle_errors
    def command(name, kit, fmt, **kwargs):
        _run(kit, fmt, op, name=name, **{key: kwargs[key]})

    command.__doc__ = doc
    return command


def _adding_command(op: str, key: str, doc: str):
    """add-site / add-user: with the participant's certificate when the server has not seen
    it yet (provisioned since it started, never connected)."""
    @click.argument("name")
    @click.argument(key)
    @click.option("--cert", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                  default=None, help=f"The {key}'s certificate (its kit's startup/client.crt), "
                  f"for a {key} provisioned since the server started that has not connected "
                  "yet; default: found in a kit folder of that name next to your own kit.")
    @kit_option
    @format_option
    @handle_errors
    def command(name, kit, fmt, cert, **kwargs):
        member = kwargs[key]
        with open_session(kit) as session:
            pem = _certificate(cert, session.kit.kit_dir, member)
            answer = session.call(op, name=name, **{key: member},
                                  **({"cert": pem} if pem else {}))
        emit(answer, fmt, _text(answer))

    command.__doc__ = doc
    return command


def _certificate(given: Path | None, own_kit: Path, member: str) -> str | None:
    """The PEM of ``member``'s certificate: --cert, or the kit ``provision add-user|add-site``
    wrote next to the admin's own kit (same project folder)."""
    path = given
    if path is None and member and "/" not in member and member not in (".", ".."):
        found = own_kit.parent / member / "startup" / "client.crt"
        path = found if found.is_file() else None
    if path is None:
        return None
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        from atoll.cli.common import fail

        fail(f"{path}: cannot read the certificate: {exc}")


study_group.command("add-site")(_adding_command(
    "study_add_site", "site", "Enrol SITE in study NAME."))
study_group.command("remove-site")(_member_command(
    "study_remove_site", "site", "Remove SITE from study NAME."))
study_group.command("add-user")(_adding_command(
    "study_add_user", "user", "Add admin USER to study NAME."))
study_group.command("remove-user")(_member_command(
    "study_remove_user", "user", "Remove admin USER from study NAME."))


@click.command("audit")
@click.option("--only-study", default=None, help="Only entries of this study.")
@click.option("--limit", type=int, default=200, show_default=True)
@kit_option
@format_option
@handle_errors
def audit_command(only_study, limit, kit, fmt):
    """Who did what in which study: logins, submits, aborts, downloads, study changes."""
    with open_session(kit) as session:
        answer = session.call("audit", only_study=only_study, limit=limit)
    lines = []
    for e in answer["entries"]:
        at = dt.datetime.fromtimestamp(e["at"]).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"{at}  {printable(e['user']):<28} {printable(e['study']):<16} "
                     f"{printable(e['action']):<18} {printable(e['target']):<34} "
                     f"{printable(e['outcome'])}")
    emit(answer, fmt, "\n".join(lines) or "no entries")
