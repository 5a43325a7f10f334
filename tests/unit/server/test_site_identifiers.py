"""What a site sends the server names jobs by ids of their grammar (server/federation_service.py)."""

from __future__ import annotations

import json

import pytest

from atoll.server.federation_service import _hello, _job_ids, _job_state

BAD = ["../x", "a/b", "x\n", "", "a\0b", 7, None, "x" * 65]


@pytest.mark.parametrize("job_id", BAD)
def test_a_hello_or_heartbeat_listing_a_crafted_job_id_is_refused(job_id):
    with pytest.raises(ValueError, match="running_jobs"):
        _hello(json.dumps({"running_jobs": ["ok", job_id]}))
    with pytest.raises(ValueError, match="running_jobs"):
        _job_ids([job_id], "heartbeat")


def test_running_jobs_are_bounded():
    with pytest.raises(ValueError, match="at most 10,000"):
        _job_ids(["j"] * 10_001, "hello")
    assert _job_ids(["0123456789abcdef0123456789abcdef", "j1"], "hello") == [
        "0123456789abcdef0123456789abcdef", "j1"]


@pytest.mark.parametrize("job_id", BAD)
def test_a_job_state_of_a_crafted_job_id_is_refused(job_id):
    with pytest.raises(ValueError, match="job_state's job_id"):
        _job_state(json.dumps({"job_id": job_id, "state": "RUNNING"}))


@pytest.mark.parametrize("state", [None, "", "x" * 65, 3])
def test_a_job_state_without_a_state_name_is_refused(state):
    with pytest.raises(ValueError, match="state name"):
        _job_state(json.dumps({"job_id": "j1", "state": state}))
