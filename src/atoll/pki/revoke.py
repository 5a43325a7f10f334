"""``atoll provision revoke``: revoke a user's or a site's certificate, federation-wide.

The project admin's ``ca/crl.pem`` lists every certificate revoked so far, signed by the CA;
each revocation rewrites it with the next CRL number and marks the participant revoked in
``ca/state.json``. Nothing changes in the federation until the new list is pushed to the
server (``atoll crl push``), which enforces it and hands it to the sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from atoll.base.files import PUBLIC, write_atomic
from atoll.pki.ca import load_ca, utcnow
from atoll.pki.crl import CRL_FILE, REASONS, Entry, build_crl, read_crl
from atoll.pki.state import ProvisionError, find, locked, write_state


@dataclass(frozen=True)
class Revocation:
    name: str
    kind: str
    serial: str  # hex, as ca/state.json and `openssl x509 -serial` show it
    reason: str
    crl: Path
    number: int  # the new list's CRL number
    revoked: int  # certificates the new list names in all


def revoke(project_dir: Path, name: str, reason: str = "unspecified") -> Revocation:
    """Add ``name``'s current certificate to ``ca/crl.pem`` (a new, higher CRL number)."""
    if reason not in REASONS:
        raise ProvisionError(f"{reason!r} is not a revocation reason; use one of: "
                             f"{', '.join(REASONS)}")
    project_dir = Path(project_dir).expanduser().resolve()
    with locked(project_dir) as state:
        known = find(state, name)
        if known is None:
            raise ProvisionError(f"{name!r} is not a participant of project {state['project']} "
                                 f"(none in {project_dir / 'ca' / 'state.json'}); check the name")
        entry = state["participants"][known]
        if entry["kind"] == "server":
            raise ProvisionError("the server's certificate cannot be revoked: nobody checks a "
                                 "list for it; re-provision the project (`atoll provision "
                                 "PROJECT.yaml --force`) to replace the CA and every kit")
        if entry.get("revoked"):
            raise ProvisionError(f"{known} was already revoked on {entry['revoked']['at'][:10]} "
                                 f"(serial {entry['serial']}); push ca/{CRL_FILE} if the server "
                                 "does not refuse it yet (`atoll crl push`)")
        ca_dir = project_dir / "ca"
        ca = load_ca(ca_dir)
        number, entries = 0, []
        if (ca_dir / CRL_FILE).exists():
            number, _, entries = read_crl((ca_dir / CRL_FILE).read_bytes(), ca.cert)
        serial = int(entry["serial"], 16)
        now = utcnow().replace(microsecond=0)
        if all(e.serial != serial for e in entries):  # already there if state.json was not saved
            entries.append(Entry(serial, now, reason))
        write_atomic(ca_dir / CRL_FILE, build_crl(ca, entries, number + 1), PUBLIC)
        entry["revoked"] = {"at": now.isoformat(), "reason": reason, "crl_number": number + 1}
        write_state(ca_dir, state)
    return Revocation(known, entry["kind"], entry["serial"], reason, ca_dir / CRL_FILE,
                      number + 1, len(entries))
