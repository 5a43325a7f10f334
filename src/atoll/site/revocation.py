"""The revocation list a site enforces on the jobs it is sent.

The server hands each site the project's CRL (a `revocations` control message after its
welcome, and again whenever a project admin pushes a newer one). The site trusts the server for
none of it: it verifies the list against the root CA of its own kit and keeps it only if it is
not older than the one it holds (`<workspace>/crl.pem`, 0600, read again at start). A job
whose signer's certificate is on it is refused before any of its code is put where it runs
(`why`, asked by the signature check, site/job_acceptance.py), whatever the job's state was when the
list arrived: a job still waiting on the server is refused when it is dispatched, one
fetched but not started yet is refused just before its launch, and one running here is aborted
(site/supervisor.py's `signers_revoked`).

One site parent runs per process, and the list it enforces is the process's (`activate`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from atoll.pki.revocation import CRLError, RevocationStore

log = logging.getLogger("atoll.site.revocation")

_active: SiteRevocations | None = None


def stale(now: float | None = None) -> str | None:
    """Why this site runs no job while its list is past its ``nextUpdate``, or None: the CA
    meant to have replaced it by then, and a server that withholds the newer list must not
    keep a revoked user's jobs running here. atoll's own lists carry the CA's end."""
    active = _active
    if active is None or not active.store.current.next_update:
        return None
    import datetime as dt
    import time

    held = active.store.current
    due = dt.datetime.fromisoformat(held.next_update)
    if due.timestamp() > (time.time() if now is None else now):
        return None
    return (f"the revocation list {held.number} this site holds was due to be replaced by "
            f"{due:%Y-%m-%d %H:%M} UTC (its nextUpdate) and the server has sent no newer one; "
            "the project admin should push the project's newest list (`atoll crl push`)")


def why(cert: Any) -> str | None:
    """Why the certificate (cryptography's, verified by the caller) is revoked, or None."""
    active = _active
    if active is None:
        return None
    entry = active.store.current.entries.get(cert.serial_number)
    if entry is None:
        return None
    return f"{entry.describe()} (revocation list {active.store.current.number})"


class SiteRevocations:
    def __init__(self, workspace: Path, ca_file: Path):
        self.store = RevocationStore(workspace, ca_file)
        self.store.load()

    def activate(self) -> None:
        global _active
        _active = self

    def on_command(self, body: dict[str, Any]) -> bool:
        """A list the server sent: kept if the project's CA signed it and it is not older;
        whether it is a newer one (the caller then aborts the jobs it revokes)."""
        pem = body.get("crl")
        try:
            if not isinstance(pem, str):
                raise CRLError("the server sent no revocation list")
            changed, held = self.store.install(pem)
        except CRLError as exc:
            log.warning("revocation list from the server refused: %s", exc)
            return False
        if changed:
            log.info("revocation list %d in force: %d certificate(s) revoked", held.number,
                     len(held.entries))
        return changed
