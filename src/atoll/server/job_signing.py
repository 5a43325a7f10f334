"""The server's check of a submitted job's signature, before the job is stored.

The CLI and Session sign every job with the submitter's own key (pki/job_signature.py). The
server takes a job only when that signature is the caller's own (so one user cannot submit a
job another user signed), chains to the project's root CA, is for the study the job is
submitted in, and covers exactly the files received; and when the signer's role and study
membership, read from the signer's certificate, allow submitting. The signature is stored with
the job (inside its folder) and every site verifies it again before it launches anything: the
server's word is never what a site relies on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from atoll.pki.identity import Identity
from atoll.server.studies import SUBMIT_ROLES, Denied, Members
from atoll.wire.job_archive import IntakeError


@dataclass(frozen=True)
class SubmissionCheck:
    """What a submitted job's signature is checked against: the project's root CA and name (the
    server's kit) and its studies."""

    ca: Path
    project: str
    studies: Members

    def verify(self, tree: Path, who: Identity, study: str) -> str:
        """The job's content digest; IntakeError (bad or foreign signature) or Denied (a signer
        who may not submit in ``study``) otherwise."""
        from atoll.pki.job_signature import SignatureError, verify_job_tree
        from atoll.server.revocation import refusal

        try:
            signed = verify_job_tree(tree, self.ca, self.project, study)
        except SignatureError as exc:
            raise IntakeError(f"job refused: {exc}") from None
        signer = signed.signer
        revoked = refusal(signed.cert_pem)  # the caller's own is checked at every call; this one
        if revoked is not None:  # signed the job, and may be another certificate of the same name
            raise IntakeError(f"job refused: the certificate that signed it: {revoked}")
        if signer != who:
            raise IntakeError(f"job refused: it was signed by {signer.name} ({signer.role}, "
                              f"{signer.org}), not by you ({who.name}); a job is submitted by the "
                              "user who signed it")
        if signer.role not in SUBMIT_ROLES:
            raise Denied(f"{signer.name} is a {signer.role}; submitting jobs needs one of "
                         f"{', '.join(SUBMIT_ROLES)}")
        self.studies.require_member(signer, study)
        return signed.digest
