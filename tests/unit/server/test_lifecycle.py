"""A job's life on the server (server/dispatch.py, server/lifecycle.py, composed by
server/jobs.py) on the in-memory store: dispatch, parts becoming RUNNING, the job's end, abort,
cancel, a site going offline, recovery. No process: the sites' control streams are recorded and
the server worker's launch is left to the test (its own tests: test_revoked_signers.py)."""

from __future__ import annotations

import asyncio
import json
import queue
from types import SimpleNamespace

import pytest

from atoll.launchers.base import Outcome, WorkerExit
from atoll.parent.worker_endpoint import WorkerTokens
from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.job_signature import SIGNATURE_FILE
from atoll.pki.revocation import RevocationList
from atoll.server.jobs import JobManager
from atoll.server.store import open_store
from atoll.server.worker_backend import ServerWorkerBackend
from atoll.spec.meta import load_meta

META = {"name": "job", "deploy_map": {"app": ["@ALL"]}}
JOB = "a" * 32


@pytest.fixture(scope="module")
def cert():
    return issue_cert(create_ca("p"), "lead", "o", "admin", "lead")


class Links:
    def __init__(self, offline=()):
        self.sent, self.offline = [], set(offline)

    def send(self, site, kind, body):
        self.sent.append((site, kind, body.get("job_id")))
        return site not in self.offline

    def send_all(self, sites, kind, body):
        return [site for site in sites if not self.send(site, kind, body)]

    def online(self):
        return {}


@pytest.fixture
def jobs(tmp_path, cert):
    woken = []
    manager = JobManager(
        store=open_store(None), studies=None, links=Links(),
        queue=SimpleNamespace(wake=lambda: woken.append(1)),
        host=SimpleNamespace(launcher=SimpleNamespace(shares_host=False)),
        tokens=WorkerTokens(), check=None, limits=None, workspace=tmp_path / "ws",
        revocations=SimpleNamespace(current=RevocationList()))
    manager._run_server_worker = lambda live: None  # the server worker is the test's
    manager.woken = woken
    tree = manager.jobs_dir / JOB / "job"
    (tree / "app").mkdir(parents=True)
    (tree / SIGNATURE_FILE).write_text(json.dumps({"certificate": cert.cert_pem().decode()}))
    manager.store.add_job(JOB, "job", "default", "lead", "o", META,
                          ["server", "site-1", "site-2"])
    return manager


def _dispatch(jobs, sites=("site-1", "site-2")):
    jobs.dispatch(jobs.store.get_job(JOB), load_meta(META), list(sites), {}, {})
    return jobs.live[JOB]


def _parts(jobs):
    record = jobs.store.get_job(JOB)
    return record.state, {p: (i["state"], i["reason"]) for p, i in record.parts.items()}


def test_a_dispatch_makes_the_job_live_and_tells_each_site(jobs):
    live = _dispatch(jobs)
    assert jobs.running(JOB) is live and jobs.running_at(JOB, "site-1") is live
    assert jobs.running_at(JOB, "site-3") is None
    assert jobs.links.sent == [("site-1", "dispatch", JOB), ("site-2", "dispatch", JOB)]
    state, parts = _parts(jobs)
    assert state == "DISPATCHED"
    assert parts["site-1"][0] == parts["site-2"][0] == "DISPATCHED"


class LauncherAsked(Exception):
    pass


@pytest.mark.parametrize("shares_host", [True, False])
def test_the_sites_are_sent_the_job_before_the_launcher_is_made(jobs, shares_host):
    """The server parent's launcher (its settings' models: pydantic, 0.1 CPU-s at the first
    job) is made for the server worker's launch, on its own thread, after the job went to its
    sites; the handoff folder of a worker on this host comes with that launch."""
    sent_when_asked = []

    class Host:
        @property
        def launcher(self):
            sent_when_asked.append(list(jobs.links.sent))
            return SimpleNamespace(shares_host=shares_host)

        def launch_request(self, record, meta, run_dir, token, shared):
            launched.append(shared)
            raise LauncherAsked  # the test ends here: nothing to start

    launched = []
    jobs.host, jobs.tokens = Host(), SimpleNamespace(issue=lambda job_id: "token")
    live = _dispatch(jobs)
    assert sent_when_asked == [] and live.relay.handoff is None
    assert jobs.links.sent == [("site-1", "dispatch", JOB), ("site-2", "dispatch", JOB)]
    with pytest.raises(LauncherAsked):
        JobManager._run_server_worker(jobs, live)
    assert sent_when_asked[0] == jobs.links.sent
    if shares_host:
        assert live.relay.handoff is not None and live.relay.handoff.path.is_dir()
        assert launched == [(live.relay.handoff.path,)]
    else:
        assert live.relay.handoff is None and launched == [()]


def test_the_job_is_running_with_its_first_running_part_whichever_it_is(jobs, tmp_path):
    live = _dispatch(jobs)
    backend = ServerWorkerBackend(jobs, jobs.store, _ca(tmp_path))
    info = backend.on_register(JOB)  # the server worker registered
    assert info["sites"] == ["site-1", "site-2"]
    assert _parts(jobs)[0] == "RUNNING" and live.record.state == "RUNNING"
    jobs.site_state("site-1", {"job_id": JOB, "state": "RUNNING"})
    state, parts = _parts(jobs)
    assert state == "RUNNING"
    assert parts["server"][0] == parts["site-1"][0] == "RUNNING"
    assert parts["site-2"][0] == "DISPATCHED"


def test_the_benchmark_switch_tells_server_workers_to_keep_no_checkpoint(jobs, tmp_path,
                                                                         monkeypatch):
    from atoll.server.worker_backend import BENCHMARK_OFF

    _dispatch(jobs)
    assert "checkpoints" not in ServerWorkerBackend(jobs, jobs.store, _ca(tmp_path)).on_register(JOB)
    monkeypatch.setenv(BENCHMARK_OFF, "1")  # bench/compare's atoll-nockpt
    assert ServerWorkerBackend(jobs, jobs.store, _ca(tmp_path)).on_register(JOB)[
        "checkpoints"] is False


def _ca(tmp_path):
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n", encoding="ascii")
    return path


def test_the_job_ends_once_the_server_and_every_site_have_ended(jobs):
    live = _dispatch(jobs)
    token = jobs.tokens.issue(JOB)
    for site in ("site-1", "site-2"):
        jobs.site_state(site, {"job_id": JOB, "state": "FINISHED:COMPLETED"})
    assert _parts(jobs)[0] == "DISPATCHED" and jobs.running(JOB) is live  # the server runs on
    live.report = (True, "")
    jobs._server_ended(live, WorkerExit(Outcome.COMPLETED, ""))
    state, parts = _parts(jobs)
    assert state == "FINISHED:COMPLETED" and parts["server"] == ("FINISHED:COMPLETED", "")
    assert jobs.running(JOB) is None and jobs.woken
    assert jobs.tokens.exchange(JOB, token) is None  # its worker's token is spent with it


def test_a_site_that_dropped_out_of_a_completed_workflow_is_named(jobs):
    live = _dispatch(jobs)
    jobs.site_state("site-2", {"job_id": JOB, "state": "FINISHED:FAILED", "reason": "oom"})
    jobs.site_state("site-1", {"job_id": JOB, "state": "FINISHED:COMPLETED"})
    live.report = (True, "")
    jobs._server_ended(live, WorkerExit(Outcome.COMPLETED, ""))
    record = jobs.store.get_job(JOB)
    assert (record.state, record.reason) == ("FINISHED:COMPLETED",
                                             "sites that dropped out: site-2: oom")


def test_a_state_from_a_site_not_in_the_job_or_already_ended_is_ignored(jobs):
    _dispatch(jobs, ["site-1"])
    jobs.site_state("site-2", {"job_id": JOB, "state": "RUNNING"})
    jobs.site_state("site-1", {"job_id": JOB, "state": "FINISHED:FAILED", "reason": "first"})
    jobs.site_state("site-1", {"job_id": JOB, "state": "FINISHED:COMPLETED"})
    _, parts = _parts(jobs)
    assert parts["site-2"][0] == "SUBMITTED"
    assert parts["site-1"] == ("FINISHED:FAILED", "first")


def test_an_abort_reaches_each_site_and_an_offline_one_ends_at_once(jobs):
    live = _dispatch(jobs)
    jobs.links.offline.add("site-2")
    jobs.links.sent.clear()
    jobs.abort(JOB, "stopped by lead")
    assert live.aborting == "stopped by lead" and live.relay.ended
    assert jobs.links.sent == [("site-1", "abort", JOB), ("site-2", "abort", JOB)]
    _, parts = _parts(jobs)
    assert parts["site-2"] == ("FINISHED:ABORTED", "stopped by lead (site offline)")
    jobs.abort(JOB, "again")  # a second abort changes nothing
    assert live.aborting == "stopped by lead" and len(jobs.links.sent) == 2
    jobs.site_state("site-1", {"job_id": JOB, "state": "FINISHED:ABORTED"})
    jobs._server_ended(live, WorkerExit(Outcome.FAILED, "cancelled"))
    record = jobs.store.get_job(JOB)
    assert (record.state, record.reason) == ("FINISHED:ABORTED", "stopped by lead")


def test_an_abort_of_a_waiting_job_cancels_every_part(jobs):
    jobs.abort(JOB, "not now")
    state, parts = _parts(jobs)
    assert state == "FINISHED:ABORTED" and set(parts.values()) == {("FINISHED:ABORTED",
                                                                     "not now")}
    assert jobs.links.sent == []


def test_a_site_going_offline_fails_its_unfinished_parts_at_once_without_a_rejoin_time(jobs):
    jobs.rejoin_s = 0
    _dispatch(jobs)
    jobs.site_state("site-2", {"job_id": JOB, "state": "FINISHED:COMPLETED"})
    jobs.site_offline("site-1")
    jobs.site_offline("site-2")
    _, parts = _parts(jobs)
    assert parts["site-1"] == ("FINISHED:FAILED", "site parent disconnected")
    assert parts["site-2"][0] == "FINISHED:COMPLETED"


def test_a_disconnected_site_parent_is_waited_for_then_fails_with_the_round(jobs):
    live = _dispatch(jobs)
    jobs.site_state("site-1", {"job_id": JOB, "state": "RUNNING"})
    task = live.relay.add_task(["site-1"], "train", {"round": 3}, [])
    asyncio.run(live.relay.wait_task("site-1", 1))  # its worker took round 3's task
    jobs.site_offline("site-1")
    _, parts = _parts(jobs)
    assert parts["site-1"] == ("RUNNING", "site parent disconnected; waiting up to 300 s for "
                                          "it to come back")
    assert "site-1" in live.away and live.relay.next_reply(task, 0) is None  # no failure yet
    jobs._rejoin_overdue(live, "site-1")  # what its timer does after rejoin_s
    _, parts = _parts(jobs)
    assert parts["site-1"] == ("FINISHED:FAILED", "site-1's site parent was disconnected for "
                                                 "more than 300 s during round 3")
    assert live.relay.next_reply(task, 0).error == "site-1 dropped out (FAILED)"


def test_a_restarted_site_parent_gets_its_part_again_and_its_task_is_retried(jobs):
    live = _dispatch(jobs)
    task = live.relay.add_task(["site-1", "site-2"], "train", {"round": 2}, [])
    asyncio.run(live.relay.wait_task("site-1", 1))
    asyncio.run(live.relay.wait_task("site-2", 1))
    jobs.site_offline("site-1")
    known = jobs.parts_at("site-1")
    jobs.links.sent.clear()
    jobs.site_back("site-1", [], known)  # it came back running nothing: its parent restarted
    assert not live.away and jobs.links.sent == [("site-1", "dispatch", JOB)]
    reply = live.relay.next_reply(task, 0)
    assert (reply.site, reply.retry) == ("site-1", True)
    assert reply.error == "site-1's site parent restarted; its part starts again"
    assert _parts(jobs)[1]["site-1"][0] == "DISPATCHED"
    jobs.links.sent.clear()
    jobs.site_back("site-2", [JOB], jobs.parts_at("site-2"))  # still runs it: nothing resent
    assert jobs.links.sent == [] and live.relay.next_reply(task, 0) is None


def _restart(jobs):
    """The parent died: its live table is gone, the store and the job folders remain."""
    jobs.live.clear()
    jobs.recover()


def test_recovery_without_resumes_fails_what_ran_and_leaves_the_rest(jobs):
    _dispatch(jobs)
    jobs.site_state("site-1", {"job_id": JOB, "state": "RUNNING"})
    jobs.site_state("site-2", {"job_id": JOB, "state": "FINISHED:COMPLETED"})
    other = "b" * 32
    jobs.store.add_job(other, "waits", "default", "lead", "o", META, ["server", "site-1"])
    jobs.max_resumes = 0
    _restart(jobs)
    record = jobs.store.get_job(JOB)
    assert record.state == "FINISHED:FAILED"
    assert "after 0 resume(s) already (restarts.max_resumes is 0); resubmit it" in record.reason
    assert record.parts["site-1"] == {**record.parts["site-1"], "state": "FINISHED:FAILED"}
    assert record.parts["site-2"]["state"] == "FINISHED:COMPLETED"
    assert jobs.store.get_job(other).state == "SUBMITTED"
    assert JOB not in jobs.live


def test_recovery_resumes_a_running_job_from_its_committed_round(jobs):
    _dispatch(jobs, sites=("site-1", "site-2"))
    started = queue.Queue()
    jobs._run_server_worker = started.put
    jobs.site_state("site-1", {"job_id": JOB, "state": "RUNNING"})
    jobs.site_state("site-2", {"job_id": JOB, "state": "FINISHED:FAILED", "reason": "oom"})
    jobs.store.add_event(JOB, "server", {"event": "checkpoint", "round": 1})
    jobs.store.add_event(JOB, "server", {"event": "checkpoint", "round": 2})
    jobs.store.add_event(JOB, "site-1", {"event": "checkpoint", "round": 7})  # a site's word
    _restart(jobs)
    live = jobs.live[JOB]
    jobs.launch_resumed()
    assert started.get(timeout=60) is live and (live.resumes, live.resume_round) == (1, 2)
    state, parts = _parts(jobs)
    assert state == "RUNNING"
    assert parts["server"] == ("DISPATCHED", "resumed at round 3 after a server restart")
    assert parts["site-1"][0] == "RUNNING" and live.site_states == {
        "site-2": ("FINISHED:FAILED", "oom")}
    task = live.relay.add_task(["site-1"], "train", {}, [b""])
    assert task.startswith("r1t") and live.relay.stale("t4") and not live.relay.stale(task)
    backend = ServerWorkerBackend(jobs, jobs.store, _ca_file(jobs))
    assert backend.on_register(JOB)["job_args"]["resume"] == {"attempt": 1, "round": 2}
    assert _parts(jobs)[1]["server"] == ("RUNNING", "resumed at round 3 after a server restart")
    assert jobs.running_at(JOB, "site-1") is live  # a reconnecting site is not told to abort


def test_a_job_resumes_max_resumes_times_then_fails_saying_so(jobs):
    jobs._run_server_worker = lambda live: None
    _dispatch(jobs)
    jobs.max_resumes = 2
    _restart(jobs)
    _restart(jobs)
    assert jobs.live[JOB].resumes == 2
    _restart(jobs)
    record = jobs.store.get_job(JOB)
    assert record.state == "FINISHED:FAILED" and "after 2 resume(s) already" in record.reason
    assert {i["state"] for i in record.parts.values()} == {"FINISHED:FAILED"}


def _ca_file(jobs):
    path = jobs.workspace / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_a_stopping_server_leaves_its_running_jobs_to_resume(jobs):
    """A server parent that stops (`helm upgrade`, `atoll server stop`) stops its server
    workers; their end is not the job's: the store keeps the job running and the next start
    resumes it. A workflow that had completed just before is recorded as completed."""
    cancelled = []
    jobs.host.launcher.cancel = cancelled.append
    live = _dispatch(jobs)
    live.handle = "the worker's handle"
    jobs.site_state("site-1", {"job_id": JOB, "state": "RUNNING"})
    jobs.stop_all()
    assert cancelled == ["the worker's handle"]
    jobs._server_ended(live, WorkerExit(Outcome.ABORTED, "aborted: the worker pod was deleted"))
    state, parts = _parts(jobs)
    assert state == "RUNNING" and not parts["server"][0].startswith("FINISHED"), parts
    assert jobs.links.sent == [("site-1", "dispatch", JOB), ("site-2", "dispatch", JOB)]
    jobs.stopping = False  # the next start
    _restart(jobs)
    resumed = jobs.live[JOB]
    assert resumed.resumes == 1

    jobs.stop_all()
    resumed.report = (True, "")
    jobs._server_ended(resumed, WorkerExit(Outcome.COMPLETED, ""))
    assert _parts(jobs)[1]["server"] == ("FINISHED:COMPLETED", "")


def test_an_abort_while_the_sites_are_sent_the_job_reaches_each_after_its_dispatch(jobs):
    # the job is live (abortable) before its dispatch goes out: an abort in that window must
    # not reach a site before the dispatch it would stop (the site would not know the job, drop
    # the abort, and then run the job for good)
    send = jobs.links.send

    def abort_at_the_first_dispatch(site, kind, body):
        if kind == "dispatch" and site == "site-1":
            jobs.abort(JOB, "aborted by lead")
        return send(site, kind, body)

    jobs.links.send = abort_at_the_first_dispatch
    _dispatch(jobs)
    for site in ("site-1", "site-2"):
        kinds = [k for s, k, _ in jobs.links.sent if s == site]
        assert "dispatch" in kinds and "abort" in kinds[kinds.index("dispatch"):], kinds
