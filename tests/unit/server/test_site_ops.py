"""The sites' calls as plain functions (server/site_ops.py) on the in-memory store: no process,
no gRPC. Every job a site names is looked up as running at that site, and only then used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.server import site_ops
from atoll.server.site_links import SiteLink
from atoll.server.site_ops import NotRunning
from atoll.server.store import open_store
from atoll.wire.bodies import Heartbeat, Hello, JobState, SiteReport


class Jobs:
    """The server's jobs as the sites' calls see them: job "j1" runs at site-a only."""

    def __init__(self, tmp: Path | None = None):
        self.tmp, self.states, self.offline = tmp, [], []

    def running_at(self, job_id, site):
        return object() if (job_id, site) == ("j1", "site-a") else None

    def app_zip(self, job_id, target):
        path = self.tmp / f"{job_id}-{target}.zip"
        path.write_bytes(b"zip")
        return path

    def site_state(self, site, body):
        self.states.append((site, body))

    def site_offline(self, site):
        self.offline.append(site)
        raise RuntimeError("the store is closed")


def _store():
    store = open_store(None)
    store.add_job("j1", "n", "s", "lead@a.org", "org-a", {}, ["site-a", "site-b"])
    return store


def test_a_report_is_kept_for_a_job_the_site_runs():
    store = _store()
    site_ops.report(store, Jobs(), "site-a",
                    SiteReport.parse(json.dumps({"job_id": "j1", "event": {"round": 3}})))
    assert [e["body"] if "body" in e else e for e in store.events("j1")][-1]["round"] == 3


@pytest.mark.parametrize("site,job", [("site-b", "j1"), ("site-a", "j2")])
def test_a_report_for_a_job_not_running_at_that_site_is_refused_and_not_kept(site, job):
    store = _store()
    before = store.events("j1")
    with pytest.raises(NotRunning, match=f"job {job} is not running at {site}"):
        site_ops.report(store, Jobs(), site,
                        SiteReport.parse(json.dumps({"job_id": job, "event": {"x": 1}})))
    assert store.events("j1") == before


def test_the_app_is_served_only_for_a_job_the_site_runs(tmp_path):
    assert site_ops.app_zip(Jobs(tmp_path), "site-a", "j1").read_bytes() == b"zip"
    with pytest.raises(NotRunning):
        site_ops.app_zip(Jobs(tmp_path), "site-b", "j1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j1-site-a.zip"]


def test_a_reconnecting_site_is_told_to_abort_only_what_the_server_no_longer_runs():
    hello = Hello.parse(json.dumps({"running_jobs": ["j1", "j2", "j3"]}))
    assert site_ops.stale_jobs(Jobs(), "site-a", hello.running_jobs) == ["j2", "j3"]
    assert site_ops.stale_jobs(Jobs(), "site-b", hello.running_jobs) == ["j1", "j2", "j3"]


def test_a_heartbeat_replaces_the_links_running_jobs():
    link = SiteLink("site-a", "org-a", Hello.parse('{"running_jobs": ["j1"]}').doc, None)
    site_ops.heartbeat(link, Heartbeat.parse('{"running_jobs": ["j2", "j3"]}'))
    assert link.running_jobs == ["j2", "j3"]


def test_a_job_state_reaches_the_jobs_with_its_site():
    jobs = Jobs()
    site_ops.job_state(jobs, "site-a", JobState.parse('{"job_id": "j1", "state": "RUNNING"}'))
    assert jobs.states == [("site-a", {"job_id": "j1", "state": "RUNNING"})]


def test_a_site_going_offline_never_raises_into_the_loop(caplog):
    jobs = Jobs()
    site_ops.offline(jobs, "site-a")
    assert jobs.offline == ["site-a"] and "could not mark the jobs of site-a" in caplog.text


def test_a_site_of_another_version_is_refused_at_hello():
    assert site_ops.hello_refusal(Hello.parse('{"version": "0.0.1"}'), "9.0.0")
