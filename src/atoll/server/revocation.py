"""The revocation list the server enforces, and how it reaches the sites.

A project admin pushes the project's CRL (`atoll crl push`, op `crl_push`); the server checks
that its own root CA signed it and that it is not older than the list it holds, keeps it in its
workspace (`crl.pem`, 0600) and applies it at once:

- every call is admitted only if the caller's certificate is not on it (`refusal`, asked by
  server/auth.py where a caller's identity is established): admins and sites alike, on
  connections and sessions opened before the push too, since each call is checked;
- the control link of a revoked site is closed (its jobs then fail as for a site that left);
- every connected site gets the list (a `revocations` control message), and each site that
  connects later gets it after its welcome: sites refuse the jobs of revoked submitters;
- every job a revoked user signed is cancelled while it waits and aborted while it runs
  (`on_change`: server/jobs.py's `signers_revoked`, with the reason its status shows); the
  scheduler and the server worker's launch ask again (server/job_signer.py).

One server parent runs per process, and the list it enforces is the process's (`activate`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atoll.pki.revocation import RevocationList, RevocationStore
from atoll.server.studies import Denied
from atoll.wire.frames import MAX_CONTROL

log = logging.getLogger("atoll.server.revocation")

_active: ServerRevocations | None = None


def refusal(cert_pem: bytes) -> str | None:
    """Why a caller's (verified) certificate is refused, or None."""
    active = _active
    return None if active is None else active.refusal(cert_pem)


class ServerRevocations:
    def __init__(self, workspace: Path, ca_file: Path, links, store=None):
        self.store = RevocationStore(workspace, ca_file)
        self.store.load()
        self.links, self.audit_store = links, store
        self._lock = threading.Lock()
        # site -> (its newest control link, that link's serial): one entry per site, so a
        # connection is watched in constant work (10,000 sites connect at once)
        self._serials: dict[str, tuple[Any, int]] = {}
        # a newer list is in force: end the jobs it revokes; the ids of those ended
        self.on_change: Callable[[RevocationList], list[str]] | None = None

    def activate(self) -> None:
        global _active
        _active = self

    @property
    def current(self) -> RevocationList:
        return self.store.current

    def refusal(self, cert_pem: bytes) -> str | None:
        try:
            entry = self.current.of(cert_pem)
        except ValueError:
            return "the server cannot read this certificate's serial number"
        if entry is None:
            return None
        return (f"this certificate is revoked ({entry.describe()}); ask the project admin "
                "for a new one (`atoll provision request`)")

    # -- sites --------------------------------------------------------------------------------
    def on_connect(self, link, context) -> None:
        """A site's control link is up: watch it, and send it the list if there is one."""
        from atoll.pki.revocation import cert_serial

        pems = context.auth_context().get("x509_pem_cert") or [b""]
        try:
            serial = cert_serial(pems[0])
        except ValueError:  # admitted, so readable; if not, it cannot be watched: drop it
            link.close()
            return
        with self._lock:
            if not link.closed.is_set():  # an older link starting late never hides the live one
                self._serials[link.name] = (link, serial)
            held = self.current
        if serial in held.entries:  # revoked between its admission and now
            link.close()
        elif held.number:
            link.send("revocations", _command(held))

    def _apply(self, held: RevocationList) -> list[str]:
        """Close the links of revoked sites, send the list to the others; the names dropped."""
        dropped = []
        with self._lock:
            watched = [v for v in self._serials.values() if not v[0].closed.is_set()]
        for link, serial in watched:
            if serial in held.entries:
                log.warning("site %s: its certificate is revoked; closing its link", link.name)
                link.close()
                dropped.append(link.name)
            else:
                link.send("revocations", _command(held))
        return dropped

    # -- admin operations (admin_service.py runs them on a thread) ---------------------------
    def ops(self) -> dict[str, Any]:
        return {"crl_push": self.push, "crl_show": self.show}

    def push(self, who, study: str, body: dict[str, Any]) -> dict[str, Any]:
        if who.role != "project_admin":
            raise Denied("only project admins may push the revocation list")
        pem = body.get("crl")
        if not isinstance(pem, str) or not pem:
            raise ValueError("crl must be the text of the project's ca/crl.pem")
        if len(pem) > MAX_CONTROL - 1024:  # it must reach the sites in one control message
            raise ValueError(f"the revocation list is {len(pem):,} bytes; a site can be sent "
                             f"at most {MAX_CONTROL - 1024:,}")
        changed, held = self.store.install(pem)  # CRLError (a ValueError): refused, not audited
        dropped = self._apply(held) if changed else []
        ended = self.on_change(held) if changed and self.on_change is not None else []
        if self.audit_store is not None:
            self.audit_store.audit(who.name, who.org, who.role or "", study, "crl_push",
                                   f"crl {held.number}", "ok" if changed else "unchanged",
                                   f"{len(held.entries)} revoked")
        log.info("revocation list %d in force: %d certificate(s) revoked", held.number,
                 len(held.entries))
        return {**_summary(held), "changed": changed, "sites_dropped": dropped,
                "jobs_ended": ended}

    def show(self, who, study: str, body: dict[str, Any]) -> dict[str, Any]:
        return _summary(self.current)


def _command(held: RevocationList) -> dict[str, Any]:
    return {"number": held.number, "crl": held.pem}


def _summary(held: RevocationList) -> dict[str, Any]:
    return {"number": held.number, "issued": held.issued,
            "revoked": [{"serial": format(e.serial, "x"), "at": e.at, "reason": e.reason}
                        for e in sorted(held.entries.values(), key=lambda e: e.at)]}
