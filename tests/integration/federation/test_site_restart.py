"""A site parent's restart and a stalled site worker, on a real local federation (issue 37):
a `kill -9` of a site parent mid-round, then `atoll site start` again: the job completes, each
round answered once by each site; a frozen worker (SIGSTOP) is stopped after
supervision.stall_s, its part started again once for the round in flight, and a second freeze
fails the part with the stall's reason, never a job left waiting."""

from __future__ import annotations

import json
import re
import signal

import pytest

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, pids_with_env, wait_for
from tests.integration.federation.jobs import make_job, round_taker

# Says which round it took (its worker log is read by the test), then takes a while to answer.
SLOW = round_taker(1.0)
STALL_S = 4


@pytest.fixture
def fed(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1", "site-2"], USERS)
    for site in fed.sites:  # small bounds: a stalled worker is noticed within seconds
        with open(fed.kit(site) / "local" / "site.yaml", "a") as out:
            out.write(f"\nsupervision: {{heartbeat_s: 0.5, stall_s: {STALL_S}}}\n")
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _worker_log(fed, job_id, site="site-1") -> str:
    path = fed.workspace(site) / "jobs" / job_id / "logs" / "worker.log"
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _workers(job_id, site="site-1") -> list[int]:
    found = []
    for pid in pids_with_env(f"ATOLL_JOB_ID={job_id}"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if f"ATOLL_SITE={site}".encode() in fh.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


def _rounds(fed, tmp_path, session, job_id):
    out = session.download(job_id, tmp_path / "results")
    result = json.loads(next(out.rglob("scatter_gather.json")).read_text())
    return [sorted(r["replies"]) for r in result["rounds"]]


def test_a_killed_site_parent_started_again_takes_its_part_back(fed, tmp_path):
    with fed.session(ADMIN) as s:
        job_id = s.submit(make_job(tmp_path / "restart", script=SLOW, rounds=4))["job_id"]
        wait_for(lambda: "took round 1" in _worker_log(fed, job_id), 60, "site-1 in round 1")
        old = _workers(job_id)
        fed.kill("site-1", signal.SIGKILL)  # mid-round: its reply to round 1 never left
        wait_for(lambda: not _workers(job_id), 15, "site-1's old worker gone")
        fed.start_site("site-1")
        final = s.wait(job_id, timeout=120)
        assert final["state"] == "FINISHED:COMPLETED", final
        assert {p["state"] for p in final["parts"].values()} == {"FINISHED:COMPLETED"}
        assert old and not set(old) & set(_workers(job_id))
        # every round once from every site: round 1 was retried for site-1, not lost or doubled
        assert _rounds(fed, tmp_path, s, job_id) == [["site-1", "site-2"]] * 4
    assert "site-1's site parent restarted; its part starts again" in fed.log("server")


def test_a_frozen_site_worker_is_restarted_once_then_failed_with_the_stall(fed, tmp_path):
    with fed.session(ADMIN) as s:
        job_id = s.submit(make_job(tmp_path / "frozen", script=SLOW, rounds=3,
                                   min_clients=2))["job_id"]
        wait_for(lambda: "took round 1" in _worker_log(fed, job_id), 60, "site-1 in round 1")
        first = wait_for(lambda: _workers(job_id), 15, "site-1's worker")
        for pid in first:
            pid_stop(pid)
        # stopped after STALL_S without a heartbeat, and started again for round 1
        second = wait_for(lambda: [p for p in _workers(job_id) if p not in first], 60,
                          "site-1's second worker")
        wait_for(lambda: "took round 1" in _worker_log(fed, job_id), 60, "round 1 again")
        for pid in second:
            pid_stop(pid)
        final = s.wait(job_id, timeout=120)
    reason = final["parts"]["site-1"]["reason"]
    assert final["parts"]["site-1"]["state"] == "FINISHED:FAILED", final
    assert re.fullmatch(rf"site-1's part sent no heartbeat for {STALL_S} s during round 1",
                        reason), reason
    assert final["state"] == "FINISHED:FAILED" and "site-1" in final["reason"]
    site_log = fed.log("site-1")
    assert "sent no heartbeat" in site_log and "its part starts again" in site_log
    wait_for(lambda: not _workers(job_id), 20, "no worker left")


def pid_stop(pid: int) -> None:
    import os

    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
