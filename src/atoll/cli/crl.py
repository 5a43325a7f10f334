"""`atoll crl push|show`: the project's certificate revocation list at the server.

`atoll provision revoke` writes the list (ca/crl.pem, signed by the CA); `push` hands it to the
server, which checks it, applies it at once and passes it on to every site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from atoll.cli.common import emit, fail, format_option, handle_errors, kit_option, open_session
from atoll.cli.common import printable as p


@click.group("crl")
def crl_group() -> None:
    """The project's certificate revocation list, as the server enforces it."""


def _listing(answer: dict[str, Any]) -> str:
    if not answer.get("number"):
        return "The server holds no revocation list."
    revoked = answer.get("revoked") or []
    lines = [f"Revocation list {p(answer['number'])} (issued {p(answer.get('issued', '?'))}): "
             f"{len(revoked)} certificate{'s' if len(revoked) != 1 else ''} revoked"]
    lines += [f"  serial {p(e['serial'])}  revoked {p(e['at'])}  {p(e['reason'])}"
              for e in revoked]
    return "\n".join(lines)


@crl_group.command("push")
@click.argument("crl", metavar="CRL", type=click.Path(exists=True, dir_okay=False,
                                                      path_type=Path))
@kit_option
@format_option
@handle_errors
def push(crl: Path, kit: Path | None, fmt: str) -> None:
    """Send CRL (the project's ca/crl.pem) to the server (project admins).

    The server checks that the project's CA signed it and that it is not older than the list
    it holds, then refuses every call made with a revoked certificate, closes the links of
    revoked sites, cancels the waiting and aborts the running jobs of revoked users, and hands
    the list to every site, which refuse the jobs of revoked users."""
    try:
        text = crl.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {crl}: {exc}; pass the project's ca/crl.pem")
    with open_session(kit) as session:
        answer = session.call("crl_push", crl=text)
    words = [f"The server enforces revocation list {p(answer['number'])} "
             f"({len(answer['revoked'])} revoked)"
             + ("." if answer.get("changed") else "; it already held this list.")]
    if answer.get("sites_dropped"):
        words.append(f"Closed the links of: {p(', '.join(answer['sites_dropped']))}.")
    if ended := answer.get("jobs_ended"):
        words.append(f"Cancelled or aborted {len(ended)} job{'s' if len(ended) != 1 else ''} "
                     f"signed by revoked users: {p(', '.join(ended))}.")
    emit(answer, fmt, " ".join(words))


@crl_group.command("show")
@kit_option
@format_option
@handle_errors
def show(kit: Path | None, fmt: str) -> None:
    """The revocation list the server enforces: its number and the serials it revokes."""
    with open_session(kit) as session:
        answer = session.call("crl_show")
    emit(answer, fmt, _listing(answer))
