"""``ca/state.json``: the project admin's register of every certificate the CA has issued.

One entry per participant name (the newest certificate under that name), with its serial and
validity; ``atoll provision revoke`` finds the serial to revoke here and marks the entry
revoked. A revoked name may be issued again (a new key, a new serial): the old entry then
moves into the new one's ``previous`` list. Every change happens under a lock on ``ca/``.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.base.files import PRIVATE, write_atomic
from atoll.pki.project import (
    ProjectError,
    check_org,
    check_role,
    check_site_name,
    check_user_name,
)
from atoll.spec.errors import EXIT_INVALID, AtollError, Issue

if TYPE_CHECKING:
    from cryptography import x509

STATE_FILE = "state.json"
STATE_VERSION = 1


class ProvisionError(AtollError):
    """Provisioning cannot proceed; the message says what to change."""

    exit_code = EXIT_INVALID


def record(cert: x509.Certificate, kind: str, org: str, role: str | None,
           folder: str | None, source: str = "provision") -> dict[str, Any]:
    """A participant's entry. ``folder``: its kit's folder in the project, None for a kit its
    owner assembled (``source: request``: the key never came here)."""
    entry: dict[str, Any] = {
        "kind": kind,
        "org": org,
        "role": role,
        "folder": folder,
        "serial": format(cert.serial_number, "x"),
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": cert.not_valid_after_utc.isoformat(),
    }
    if source != "provision":
        entry["source"] = source
    return entry


def write_state(ca_dir: Path, state: dict[str, Any]) -> None:
    write_atomic(ca_dir / STATE_FILE, json.dumps(state, indent=2) + "\n", PRIVATE)


def read_state(project_dir: Path) -> dict[str, Any]:
    state_path = project_dir / "ca" / STATE_FILE
    if not state_path.is_file():
        raise ProvisionError(
            f"not a provisioned project folder: {state_path} missing; pass the folder "
            "`atoll provision PROJECT.yaml --out DIR` wrote (DIR/<project>)"
        )
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"cannot read {state_path}: {exc}") from None
    if not isinstance(state, dict) or state.get("format_version") != STATE_VERSION:
        raise ProvisionError(f"{state_path} is not an atoll CA state (format_version 1)")
    return state


@contextmanager
def locked(project_dir: Path) -> Iterator[dict[str, Any]]:
    """The state, read under an exclusive lock on ``ca/`` (two runs at once would both pass
    the duplicate check, or both number their CRL alike). The lock leaves no file behind."""
    read_state(project_dir)  # a clear error before taking the lock in a wrong folder
    fd = os.open(project_dir / "ca", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield read_state(project_dir)
    finally:
        os.close(fd)  # releases the lock


def find(state: dict[str, Any], name: str) -> str | None:
    """The name as provisioned (names are unique case-insensitively), or None."""
    taken = {known.lower(): known for known in state["participants"]}
    return taken.get(name.lower())


def identity_checks(name: str, org: str, role: str | None) -> list[tuple[str, Any, Any]]:
    """The checks of a new participant's fields: a site's without a role, a user's with one."""
    if role is None:
        return [("name", check_site_name, name), ("org", check_org, org)]
    return [("name", check_user_name, name), ("org", check_org, org), ("role", check_role, role)]


def check_new(project_dir: Path, state: dict[str, Any], name: str,
              checks: list[tuple[str, Any, Any]], folder: bool = True) -> None:
    """ProjectError listing every problem with a new participant: its fields, a name already
    issued (unless that certificate was revoked) and, with ``folder``, a kit folder in the way."""
    issues: list[Issue] = []
    for field, check, value in checks:
        try:
            check(value)
        except ValueError as exc:
            issues.append(Issue(field, str(exc)))
    known = find(state, name)
    entry = state["participants"][known] if known else None
    if entry is not None and not entry.get("revoked"):
        issues.append(Issue("name", f"{name!r} is already provisioned (the {entry['kind']} "
                                    f"{known!r}); revoke it first (`atoll provision revoke`) "
                                    "to issue it a new certificate"))
    elif entry is not None and known != name:
        issues.append(Issue("name", f"{name!r} was provisioned as {known!r}; use that spelling"))
    elif folder and (project_dir / name).exists():
        issues.append(Issue("name", f"{project_dir / name} already exists; remove it first"))
    if issues:
        raise ProjectError(issues, f"cannot add {name!r} to {project_dir}")


def add_entry(state: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    """Record ``entry`` under ``name``; a revoked predecessor is kept in its ``previous``."""
    old = state["participants"].get(name)
    if old is not None:
        entry["previous"] = [*old.pop("previous", []), old]
    state["participants"][name] = entry
