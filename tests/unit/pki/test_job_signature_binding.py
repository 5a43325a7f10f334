"""A verified signature is bound to its project and its study (pki/job_signature.bind): a job
signed for another project, or another study, is refused naming both."""

from __future__ import annotations

import pytest

from atoll.pki.identity import Identity
from atoll.pki.job_signature import SignatureError, Signed, Statement, bind

LEAD = Identity("lead@a.org", "org-a", "admin", "lead")


def _signed(project: str, study: str) -> Signed:
    return Signed(LEAD, Statement(project, study, LEAD.name, 1_700_000_000, {"meta.json": "0"}))


def test_a_job_signed_for_another_project_is_refused():
    with pytest.raises(SignatureError, match="signed for project 'other', not 'pathology'"):
        bind(_signed("other", "trial"), "pathology", "trial")


def test_a_job_signed_for_another_study_is_refused():
    with pytest.raises(SignatureError, match="signed for study 'trial' and submitted in study "
                                             "'other'"):
        bind(_signed("pathology", "trial"), "pathology", "other")


def test_a_job_signed_for_this_project_and_study_passes():
    bind(_signed("pathology", "trial"), "pathology", "trial")
