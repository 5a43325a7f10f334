"""The server's checks of a stored job's signer against the list it holds (server/job_signer.py
and server/jobs.py): waiting jobs of a revoked signer are cancelled with the reason, the
scheduler never dispatches one, and a job whose signature is gone from its folder never runs.
Real certificates and the real SQLite job store; the sites and launcher are recorded."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.job_signature import SIGNATURE_FILE
from atoll.pki.revocation import RevocationList, Revoked
from atoll.server.job_signer import revoked_signer
from atoll.server.jobs import JobManager
from atoll.server.sqlite_store import SqliteStore
from atoll.spec.meta import load_meta

META = {"name": "job", "deploy_map": {"app": ["@ALL"]}}


@pytest.fixture(scope="module")
def certs():
    ca = create_ca("p")
    return {name: issue_cert(ca, name, "o", "admin", "lead") for name in ("gone", "stays")}


def stored_job(tree: Path, cert) -> Path:
    tree.mkdir(parents=True)
    (tree / SIGNATURE_FILE).write_text(json.dumps({"certificate": cert.cert_pem().decode()}))
    return tree


def listing(*certs, number: int = 4) -> RevocationList:
    return RevocationList(number, "2026-01-01T00:00:00+00:00", {
        c.cert.serial_number: Revoked(c.cert.serial_number, "2026-02-03T04:05:06+00:00",
                                      "affiliation-changed") for c in certs})


def test_the_signer_is_read_from_the_jobs_own_signature(tmp_path, certs):
    tree = stored_job(tmp_path / "job", certs["gone"])
    held = listing(certs["gone"])
    assert revoked_signer(tree, held) == (
        f"the submitter's certificate was revoked (serial {certs['gone'].serial_hex}, revoked "
        "by the project admin on 2026-02-03, reason: affiliation-changed; revocation list 4)")
    assert revoked_signer(stored_job(tmp_path / "other", certs["stays"]), held) is None
    assert revoked_signer(tree, RevocationList()) is None


@pytest.mark.parametrize("damage", [
    lambda t: (t / SIGNATURE_FILE).unlink(),
    lambda t: (t / SIGNATURE_FILE).write_text("{not json"),
    lambda t: (t / SIGNATURE_FILE).write_text(json.dumps({"certificate": "no"})),
    lambda t: (t / SIGNATURE_FILE).write_text(json.dumps(["a list"])),
])
def test_a_job_whose_signature_is_gone_or_broken_does_not_run(tmp_path, certs, damage):
    tree = stored_job(tmp_path / "job", certs["stays"])
    damage(tree)
    assert "signature in the server's store cannot be read" in revoked_signer(tree, listing())


class Links:
    def __init__(self):
        self.sent = []

    def send(self, site, kind, body):
        self.sent.append((site, kind, body.get("job_id")))
        return True

    def send_all(self, sites, kind, body):
        return [site for site in sites if not self.send(site, kind, body)]

    def online(self):
        return {}


@pytest.fixture
def manager(tmp_path):
    store = SqliteStore(tmp_path / "ws" / "atoll.db")
    held = SimpleNamespace(current=RevocationList())
    launcher = SimpleNamespace(shares_host=False,
                               launch=lambda request: pytest.fail("a worker was launched"))
    jobs = JobManager(store=store, studies=None, links=Links(), queue=SimpleNamespace(
        wake=lambda: None), host=SimpleNamespace(launcher=launcher), tokens=None, check=None,
        limits=None, workspace=tmp_path / "ws", revocations=held)
    yield jobs
    store.close()


def submitted(jobs: JobManager, job_id: str, cert) -> None:
    stored_job(jobs.jobs_dir / job_id / "job", cert)
    jobs.store.add_job(job_id, "job", "default", "u", "o", META, ["server", "site-1"])


def test_a_newer_list_cancels_the_waiting_jobs_it_revokes(manager, certs):
    submitted(manager, "a" * 32, certs["gone"])
    submitted(manager, "b" * 32, certs["stays"])
    assert manager.signers_revoked(listing(certs["gone"])) == ["a" * 32]
    gone, stays = manager.store.get_job("a" * 32), manager.store.get_job("b" * 32)
    assert gone.state == "FINISHED:ABORTED"
    assert gone.reason.startswith("cancelled: the submitter's certificate was revoked (serial ")
    assert {p["state"] for p in gone.parts.values()} == {"FINISHED:ABORTED"}
    assert all(p["reason"] == gone.reason for p in gone.parts.values())
    assert stays.state == "SUBMITTED"
    assert manager.links.sent == []


def test_the_scheduler_never_dispatches_a_job_of_a_revoked_signer(manager, certs):
    """However it came to be in the queue (an edited store, a list pushed meanwhile)."""
    submitted(manager, "c" * 32, certs["gone"])
    manager.revocations.current = listing(certs["gone"], number=5)
    record = manager.store.get_job("c" * 32)
    manager.dispatch(record, load_meta(META), ["site-1"], {}, {})
    assert manager.live == {} and manager.links.sent == []
    job = manager.store.get_job("c" * 32)
    assert job.state == "FINISHED:ABORTED"
    assert job.reason.startswith("cancelled: the submitter's certificate was revoked")
    assert "revocation list 5" in job.reason


def dispatched(jobs: JobManager, job_id: str, cert):
    """A job made live by a dispatch to site-1, its server worker not started yet."""
    submitted(jobs, job_id, cert)
    (jobs.jobs_dir / job_id / "job" / "app").mkdir()
    jobs._run_server_worker = lambda live: None  # the test starts it, in this thread
    jobs.dispatch(jobs.store.get_job(job_id), load_meta(META), ["site-1"], {}, {})
    assert jobs.links.sent[-1] == ("site-1", "dispatch", job_id)
    return jobs.live[job_id]


def test_a_newer_list_aborts_the_running_jobs_it_revokes(manager, certs):
    gone = dispatched(manager, "d" * 32, certs["gone"])
    stays = dispatched(manager, "e" * 32, certs["stays"])
    manager.links.sent.clear()
    assert manager.signers_revoked(listing(certs["gone"])) == ["d" * 32]
    assert gone.aborting.startswith("aborted: the submitter's certificate was revoked")
    assert manager.links.sent == [("site-1", "abort", "d" * 32)]
    assert stays.aborting is None


def test_a_list_that_came_after_the_dispatch_stops_the_server_worker_before_it_starts(
        manager, certs):
    live = dispatched(manager, "f" * 32, certs["gone"])
    manager.tokens = SimpleNamespace(issue=lambda job_id: "token")
    manager.host.launch_request = lambda *args: "request"
    manager.revocations.current = listing(certs["gone"], number=6)  # arrived meanwhile
    JobManager._run_server_worker(manager, live)  # the launcher fails the test if it is asked
    assert live.aborting.startswith("aborted before the server worker started: the submitter")
    job = manager.store.get_job("f" * 32)
    assert job.parts["server"]["state"] == "FINISHED:ABORTED"
    assert "revocation list 6" in job.parts["server"]["reason"]
