"""What a site states in a job's provenance record (pki/provenance.py), signed with its own key
(the site kit's client.key) where it decided, and sent to the server with its state report.

Two entries per job it launches: ``site.decision`` (the rule of its ``authorization.json``
that allowed each right, the approval it found where ``code_approval: required``, the digests
of its authorization.json and privacy.yaml as they were read) and ``site.launch`` (its
launcher, the digest of what it rendered, the image and the image's content digest where the
launcher reports one, the dataset names and modes the study maps here, each with the content
fingerprint the site chooses to publish (study_runtime.yaml's ``fingerprint``), never their
host paths or PVC names, and the site's atoll version). Each is bound to the job's signed
statement the site verified itself, so the server can place it in the record but not change
it or write one in the site's name.

Signing loads cryptography in the site parent when the job is launched, never at rest; the key
stays in the process that already holds it (pki/job_signature.py says why parents avoid it).
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.pki.provenance import ProvenanceError, site_entry

if TYPE_CHECKING:
    from atoll.pki.job_signature import Signed
    from atoll.pki.kit import Kit
    from atoll.spec.study_runtime import StudyEntry

log = logging.getLogger("atoll.site.provenance")


def _file_digest(path: Path) -> str | None:
    try:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def decision_body(kit: Kit, study: str, signed: Signed) -> dict[str, Any]:
    """Which rule allowed each right, and the approval, as the site's policy says now."""
    from atoll.site.approvals import ApprovalsError, read_approvals
    from atoll.spec.authorization import SITE_RIGHTS, Actor, load_policy

    signer = signed.signer
    policy = load_policy(kit.local_dir)
    actor = Actor(signer.name, signer.org, signer.role)
    rules = {right: str(policy.decide(right, study, actor, actor, kit.org).rule)
             for right in SITE_RIGHTS}
    body: dict[str, Any] = {
        "decision": "accepted", "study": study, "submitter": signer.name,
        "content_digest": signed.digest, "rules": rules,
        "authorization_digest": _file_digest(kit.local_dir / "authorization.json"),
        "privacy_digest": _file_digest(kit.local_dir / "privacy.yaml"),
        "code_approval": "required" if policy.approval_required(study) else "not required"}
    if policy.approval_required(study):
        try:
            approval = read_approvals(kit.local_dir).get(signed.digest)
        except ApprovalsError:
            approval = None
        body["approval"] = {"digest": signed.digest, **(approval or {})}
    return body


def launch_body(launcher: str, entry: StudyEntry | None, extra: dict[str, Any],
                version: str) -> dict[str, Any]:
    """What the launcher ran: its render's digest, the image and its digest where the engine
    reports one, and the dataset names, modes and published fingerprints (never their
    sources)."""
    body: dict[str, Any] = {"launcher": launcher, "atoll_version": version}
    if entry is not None:
        body["datasets"] = [{"name": n, "mode": d.mode,
                             **({"fingerprint": d.fingerprint} if d.fingerprint else {})}
                            for n, d in sorted(entry.datasets.items())]
        if entry.container is not None:
            body["image"] = str(getattr(entry.container, "image", ""))
    if "image" not in body and isinstance(extra.get("image"), str) and extra["image"]:
        body["image"] = extra["image"][:400]  # the site's default image
    for key in ("image_id", "image_digest", "render_digest"):
        if isinstance(extra.get(key), str):
            body[key] = extra[key][:200]
    return body


def sign_entries(kit: Kit, job_id: str, signed: Signed,
                 bodies: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The report's fields that carry the site's signed entries; {} when they cannot be signed
    (the job still runs: the record then lacks them, the site's job log has the decision)."""
    try:
        key, cert = kit.key.read_bytes(), kit.cert.read_bytes()
        at = int(time.time())
        items = [site_entry(job_id, signed.statement_digest, kind, kit.name, body, key, cert,
                            at) for kind, body in bodies]
    except (OSError, ProvenanceError, ValueError) as exc:
        log.error("job %s: its provenance entries were not signed: %s", job_id, exc)
        return {}
    return {"provenance": items, "certificate": cert.decode("ascii")}
