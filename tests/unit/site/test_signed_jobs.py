"""The site's record of the signed jobs it ran (site/signed_jobs.py)."""

from __future__ import annotations

import json
import stat

import pytest

from atoll.site.signed_jobs import RECORD_FILE, Replayed, SignedJobs


def test_a_statement_runs_under_its_first_id_only(tmp_path):
    record = SignedJobs(tmp_path)
    record.claim("sha256:aa", "job-1", "site-1", "u@x.org")
    record.claim("sha256:aa", "job-1", "site-1", "u@x.org")  # a resume: accepted
    with pytest.raises(Replayed, match="already ran here as job job-1.*new id job-2"):
        record.claim("sha256:aa", "job-2", "site-1", "u@x.org")
    record.claim("sha256:bb", "job-2", "site-1", "u@x.org")  # signed anew: a new statement
    assert record.job_of("sha256:aa") == "job-1" and record.job_of("sha256:bb") == "job-2"


def test_the_record_survives_a_new_parent_and_is_private(tmp_path):
    SignedJobs(tmp_path).claim("sha256:aa", "job-1", "site-1", "u@x.org")
    with pytest.raises(Replayed):
        SignedJobs(tmp_path).claim("sha256:aa", "job-9", "site-1", "u@x.org")
    path = tmp_path / RECORD_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [RECORD_FILE]  # no temporary file left


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"format": "other", "jobs": {}})])
def test_a_record_it_cannot_read_refuses_rather_than_runs(tmp_path, text):
    (tmp_path / RECORD_FILE).write_text(text)
    with pytest.raises(Replayed, match="repair or remove it"):
        SignedJobs(tmp_path).claim("sha256:aa", "job-1", "site-1", "u@x.org")


def test_no_statement_digest_is_refused(tmp_path):
    with pytest.raises(Replayed):
        SignedJobs(tmp_path).claim("", "job-1", "site-1", "u@x.org")
