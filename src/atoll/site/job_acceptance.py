"""What a site checks in a job it fetched, before any of the job's code is put where it runs.

The server is trusted to store and relay jobs, not to change them: the site takes the job's
signature, its signer and its content from the job itself, never from the server's word.

1. The signature (pki/job_signature.py, checked in a process of its own: a parent never loads
   cryptography): a user certificate issued by the project's root CA in this site's own kit,
   valid now and not on the project's revocation list as this site holds it
   (site/revocation.py), whose key signed the statement; the statement is for this project and
   for the study the job was dispatched in.
2. The content: meta.json, then every file of this site's app, byte for byte as signed; a file
   added, missing or changed is a refusal. (The server sends each site only its own app.)
3. The meta the server dispatched (what the site admitted against its capacity) is the signed
   meta.json, and the server's ``study`` and ``submitter`` are the signed ones. Both are
   checked as spec/meta_plain.py checks a meta: in plain Python for the common shape, by the
   models for any other.
4. This site's ``local/authorization.json`` (spec/authorization.py): the signer's role and org,
   from their certificate, must be granted ``submit_job`` and ``byoc`` here for this study.
5. Code approval, where the policy requires it: the content digest must be approved
   (site/approvals.py).
6. This site's ``local/privacy.yaml`` (spec/privacy.py), if it has one: the app's ``privacy``
   section must ask for at least what the site requires (each missing rule named). The worker
   checks it again and applies it (atoll.fl.privacy.site_privacy).

Each refusal says which check failed and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.pki.job_signature import SignatureError, Signed, bind, check_files, verify_apart
from atoll.site import revocation
from atoll.spec.authorization import SITE_RIGHTS, Actor, load_policy
from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.spec.meta_plain import META_FILE, Meta, check_meta, read_meta, read_meta_bytes

if TYPE_CHECKING:
    from atoll.pki.kit import Kit


class JobRefused(AtollError):
    """This site will not run the job; the message is the reason its status shows."""

    exit_code = EXIT_INVALID
    signed: Signed | None = None  # set when the job was verified as signed, then refused


@dataclass(frozen=True)
class Accepted:
    signed: Signed
    meta: Meta


def check_job(tree: Path, body: dict[str, Any], kit: Kit,
              dispatched: Meta | None = None) -> Accepted:
    """Checks 1-5 on the unpacked job in ``tree`` (meta.json and this site's app) dispatched
    with ``body``, whose meta the site parsed already (``dispatched``; parsed here when None);
    JobRefused names what failed."""
    site, study = kit.name, str(body.get("study"))
    try:
        signed, files = verify_apart(tree, kit.ca)
        bind(signed, kit.project, study)
        # meta.json first: it names this site's app, whose files are checked next
        check_files(signed.statement, {META_FILE: files.get(META_FILE, "")},
                    scope=lambda path: path == META_FILE)
        meta = read_meta(read_meta_bytes(tree / META_FILE))
        app = meta.app_for(site)
        check_files(signed.statement, files,
                    scope=lambda path: path.split("/", 1)[0] in (app, META_FILE))
        _check_dispatch(body, meta, signed, dispatched)
    except SignatureError as exc:
        raise JobRefused(f"{site} refused the job: {exc}. The job was changed after it was "
                         "signed (on the wire, in the server's store or by the server), or was "
                         "never signed by a user of this project; nothing of it ran here; "
                         "the submitter should submit the job folder again") from None
    try:
        check_revoked(site, signed)
        _check_policy(kit, study, signed)
        if app is not None:
            check_privacy(site, kit.local_dir, tree / app)
    except JobRefused as exc:  # refused by this site's own rules: its log and record name it
        exc.signed = signed
        raise
    return Accepted(signed, meta)


# spec/privacy.py's POLICY_FILE: that module's models load only at a site that has the file.
PRIVACY_FILE = "privacy.yaml"


def has_privacy_policy(local_dir: Path) -> bool:
    """Whether the site has a ``local/privacy.yaml`` (as spec/privacy.load_site_policy asks)."""
    return (Path(local_dir) / PRIVACY_FILE).exists()


def check_privacy(site: str, local_dir: Path, app_dir: Path) -> None:
    """Check 6: refuse a job whose privacy settings are weaker than the site's policy."""
    if not has_privacy_policy(local_dir):
        return
    from atoll.spec.privacy import load_site_policy, policy_violations, read_app_privacy

    policy = load_site_policy(local_dir)  # re-read at every launch; SpecError if broken
    if policy is None:
        return
    violations = policy_violations(read_app_privacy(app_dir), policy)
    if violations:
        raise JobRefused(f"{site} refused the job by its privacy policy (local/privacy.yaml): "
                         + "; ".join(map(str, violations))
                         + "; nothing of it ran here")


class _Serial:
    """What site/revocation.why reads of a certificate: its serial, read without cryptography."""

    def __init__(self, cert_pem: bytes):
        from atoll.pki.revocation import cert_serial

        self.serial_number = cert_serial(cert_pem)


def revoked(signed: Signed) -> str | None:
    """Why the job's signer may not run code here by the newest revocation list this site
    holds, or because that list is past its nextUpdate (asked again just before launch, and for
    running jobs when a newer list comes)."""
    try:
        reason = revocation.why(_Serial(signed.cert_pem))
    except ValueError:
        reason = "its serial number cannot be read"
    if reason:
        return f"the certificate of {signed.signer.name} that signed the job is revoked: {reason}"
    return revocation.stale()


def check_revoked(site: str, signed: Signed) -> None:
    if why := revoked(signed):
        raise JobRefused(f"{site} refused the job: {why}; nothing of it ran here")


def _check_dispatch(body: dict[str, Any], meta: Meta, signed: Signed,
                    parsed: Meta | None) -> None:
    served = body.get("meta")
    if not isinstance(served, dict):
        raise SignatureError("the server sent no meta with the job")
    if served.get("submitter") != signed.signer.name or served.get("study") != body.get("study"):
        raise SignatureError(f"the server names {served.get('submitter')!r} in study "
                             f"{served.get('study')!r} as the job's submitter; "
                             f"{signed.signer.name} signed it for study "
                             f"{signed.statement.study!r}")
    if parsed is None:
        parsed = check_meta(served)
    dispatched = parsed.model_dump(mode="json")  # study, submitter dropped
    signed_meta = meta.model_dump(mode="json")
    differ = sorted(k for k in dispatched.keys() | signed_meta.keys()
                    if dispatched.get(k) != signed_meta.get(k))
    if differ:
        raise SignatureError(f"the meta the server dispatched differs from the signed "
                             f"meta.json in {', '.join(differ)}")


def _check_policy(kit: Kit, study: str, signed: Signed) -> None:
    from atoll.site.approvals import ApprovalsError, is_approved

    site, signer = kit.name, signed.signer
    policy = load_policy(kit.local_dir)  # re-read at every launch, like study_runtime.yaml
    actor = Actor(signer.name, signer.org, signer.role)
    for right in SITE_RIGHTS:
        decision = policy.decide(right, study, actor, actor, kit.org)
        if not decision.allowed:
            raise JobRefused(f"{site} refused the job by its policy (rule {decision.rule}): "
                             f"{decision.reason}; the site operator decides who runs code here")
    if not policy.approval_required(study):
        return
    try:
        approved = is_approved(kit.local_dir, signed.digest)
    except ApprovalsError as exc:
        raise JobRefused(f"{site} refused the job: {exc}") from None
    if not approved:
        raise JobRefused(
            f"{site} runs only jobs its operator approved (local/authorization.json "
            f"code_approval: required) and this job's content {signed.digest} is not approved; "
            f"after reviewing the job folder, the operator of {site} approves it with `atoll "
            f"site approve <kit of {site}> JOB_DIR`, then the job is submitted again")
