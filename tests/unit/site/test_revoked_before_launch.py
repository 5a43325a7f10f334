"""A site asks the newest revocation list it holds once more just before it launches a job
(a list may arrive while the job is fetched and checked), never launches a job aborted
meanwhile, and aborts the running jobs a newer list revokes (site/supervisor.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from atoll.parent.worker_endpoint import WorkerTokens
from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.identity import Identity
from atoll.pki.job_signature import Signed, Statement
from atoll.site import revocation
from atoll.site.job_acceptance import Accepted
from atoll.site.supervisor import SiteJob, Supervisor
from atoll.spec.meta import load_meta
from atoll.spec.study_runtime import load_study_runtime

SEED = Path(__file__).parents[2] / "fixtures/seed"
JOB_ID = "d" * 32
SIGNER = "leaver@a.org"


@pytest.fixture(scope="module")
def signed() -> Signed:
    cert = issue_cert(create_ca("p"), SIGNER, "a", "admin", "lead")
    return Signed(Identity(SIGNER, "a", "admin", "lead"),
                  Statement("p", "pathology", SIGNER, 0, {}), cert.cert_pem())


class Launcher:
    name = "process"

    def __init__(self):
        self.launched, self.cancelled = [], []
        self.cancel_called = threading.Event()

    def launch(self, request, on_progress=None):
        self.launched.append(request)
        raise AssertionError("the job was launched")

    def cancel(self, handle):
        self.cancelled.append(handle)
        self.cancel_called.set()


class Host:
    def __init__(self, local: Path):
        self.local, self.launcher = local, Launcher()

    def study_runtime(self):
        return load_study_runtime(self.local, "process")

    def capacity(self):
        return {}

    def runs_root(self):
        return self.local.parent / "ws"

    def launch_request(self, job, name, meta, token):
        return SimpleNamespace(job=job)

    def rejoin_to(self):
        return None  # re-attach off (the process launcher's)


class Link:
    def __init__(self):
        self.states = []

    def send_state(self, job_id, state, reason="", **extra):
        self.states.append((job_id, state, reason))


@pytest.fixture
def supervisor(tmp_path, monkeypatch, signed):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text((SEED / "site_process.yaml").read_text())
    (local / "study_runtime.yaml").write_text((SEED / "study_runtime_process.yaml").read_text())
    kit = SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws")
    sup = Supervisor(kit, host=Host(local), link=Link(), server=None, tokens=WorkerTokens())
    meta = load_meta(SEED / "meta.json")
    monkeypatch.setattr(sup, "_fetch", lambda job, body, dispatched: Accepted(signed, meta))
    return sup


def body() -> dict:
    meta = load_meta(SEED / "meta.json").with_server_fields("pathology", SIGNER)
    return {"job_id": JOB_ID, "study": "pathology", "name": "j",
            "meta": meta.model_dump(mode="json")}


def test_a_list_that_came_while_the_job_was_checked_stops_its_launch(supervisor, monkeypatch):
    fetch = supervisor._fetch

    def fetched_then_revoked(*args):
        accepted = fetch(*args)  # the check passed with the list of then; a newer one comes
        monkeypatch.setattr(revocation, "why", lambda cert: "serial 1f (revocation list 2)")
        return accepted

    monkeypatch.setattr(supervisor, "_fetch", fetched_then_revoked)
    supervisor._run(body())
    assert supervisor.host.launcher.launched == []
    [(job_id, state, reason)] = supervisor.link.states
    assert (job_id, state) == (JOB_ID, "FINISHED:FAILED")
    assert reason == (f"hospital-a refused the job: the certificate of {SIGNER} that signed "
                      "the job is revoked: serial 1f (revocation list 2); nothing of it ran here")
    assert supervisor.running_jobs() == []


def test_a_job_aborted_while_it_was_fetched_never_starts(supervisor, monkeypatch):
    fetch = supervisor._fetch

    def fetched_while_aborted(*args):
        supervisor.abort(JOB_ID, "aborted: the submitter's certificate was revoked")
        return fetch(*args)

    monkeypatch.setattr(supervisor, "_fetch", fetched_while_aborted)
    supervisor._run(body())
    assert supervisor.host.launcher.launched == []
    assert supervisor.link.states == [
        (JOB_ID, "FINISHED:ABORTED", "aborted: the submitter's certificate was revoked")]


def test_a_newer_list_aborts_the_running_jobs_it_revokes_here(supervisor, monkeypatch, signed):
    running = SiteJob(JOB_ID, "pathology", Path("/nonexistent"), None, signed=signed,
                      handle=SimpleNamespace(id="h1"))
    unchecked = SiteJob("e" * 32, "pathology", Path("/nonexistent"), None)  # still fetching
    supervisor.jobs.update({running.job_id: running, unchecked.job_id: unchecked})
    monkeypatch.setattr(revocation, "why", lambda cert: None)
    assert supervisor.signers_revoked() == []
    monkeypatch.setattr(revocation, "why", lambda cert: "serial 1f (revocation list 3)")
    assert supervisor.signers_revoked() == [JOB_ID]
    assert running.aborting == (f"aborted by hospital-a: the certificate of {SIGNER} that "
                                "signed the job is revoked: serial 1f (revocation list 3)")
    assert unchecked.aborting is None  # its own check, or the one before launch, will ask
    assert supervisor.host.launcher.cancel_called.wait(30)  # on a thread of its own
    assert supervisor.host.launcher.cancelled == [running.handle]


def test_an_abort_that_comes_before_the_job_is_admitted_is_kept(supervisor, monkeypatch):
    # the dispatch's thread has not reached admission (it parses the meta first) when the
    # server's abort arrives on the link: the abort is kept for it and the job never starts
    run, done = supervisor._run, threading.Event()

    def aborted_on_arrival(body):
        try:
            supervisor.abort(JOB_ID, "aborted by lead@a.org")
            run(body)
        finally:
            done.set()

    monkeypatch.setattr(supervisor, "_run", aborted_on_arrival)
    supervisor.dispatch(body())
    assert done.wait(30)
    assert supervisor.host.launcher.launched == []
    assert supervisor.link.states == [(JOB_ID, "FINISHED:ABORTED", "aborted by lead@a.org")]
    assert supervisor.running_jobs() == [] and not supervisor._arriving
