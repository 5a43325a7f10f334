"""A server parent that *stops* mid-job (SIGTERM: `atoll server stop`, the kubelet during a
`helm upgrade`) leaves its running jobs to the next start, as a killed one does: it stops its
server workers without recording their end as the job's, and the restarted server resumes the
job from its last checkpoint (issue 37; test_server_resume.py kills it with -9 instead)."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.test_server_resume import (
    ROUNDS,
    _job,
    _kill_when_held,
    _train_rows,
)


@pytest.fixture
def fed(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1", "site-2"], USERS)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def test_a_server_stopped_in_round_3_resumes_the_job_when_it_starts_again(fed, tmp_path):
    with fed.session(ADMIN) as s:
        job_id = s.submit(_job(tmp_path / "cut", "fedavg", "in-round-3"))["job_id"]
    _kill_when_held(fed, job_id, "in-round-3", signal.SIGTERM, timeout=60)
    fed.start_server()
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=300)
        assert final["state"] == "FINISHED:COMPLETED", (final["reason"], final["parts"])
        status = s.status(job_id)
        out = s.download(job_id, tmp_path / "out")
    assert "resumed at round 3 after a server restart" in str(status), status
    assert _train_rows(out) == Counter({(str(r), site): 1 for r in range(1, ROUNDS + 1)
                                        for site in ("site-1", "site-2", "global")})
