"""The admin audit log's entries: each call's outcome, and refusals counted, not repeated."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atoll.server.auth import AuditThrottle, cert_note

if TYPE_CHECKING:
    from atoll.pki.identity import Identity
    from atoll.server.store import Store


class Audit:
    def __init__(self, store: Store):
        self.store = store
        self._throttle = AuditThrottle()

    def record(self, who: Identity, study: str, action: str, target: str, outcome: str,
               detail: str = "") -> None:
        self.store.audit(who.name, who.org, who.role or "", study, action, target, outcome,
                         detail)

    def refused(self, who: Identity, fingerprint: str, study: str, action: str, target: str,
                detail: str) -> None:
        """An entry for a refused call (repeats of one are counted: auth.AuditThrottle)."""
        target = target[:200]
        suffix = self._throttle.note((fingerprint, study, action, target))
        if suffix is not None:
            self.record(who, study, action, target, "refused",
                        f"{detail[:500]}{suffix} {cert_note(fingerprint)}")


def target_of(body: dict[str, Any], study: str) -> str:
    """What a refused call was about, for the audit log."""
    for key in ("job_id", "name"):
        if isinstance(body.get(key), str | int):
            return str(body[key])
    return study
