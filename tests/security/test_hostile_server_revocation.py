"""Revocation reaches every stage (issue 32): on a real federation, a job whose submitter is
revoked while it waits in the queue is cancelled with the reason and none of its code runs,
on the server (its ``initial_model``) or at a site; one that runs is aborted at the server and
at its sites; and a job store edited to put the revoked user's job back in the queue does not
bring it back to life: the server parent cancels it again, and a server parent whose own checks
are switched off (its queue says "run") still gets a server worker that refuses to run it and
sites that refuse it.

Each job's server-side code prints and writes a value of its own (MARK): where it appears in
the server's or a site's workspace, that code ran.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.federation.harness import Federation, job_folder, pids_with_env, wait_for
from tests.integration.federation.jobs import ECHO, STALL

ADMIN, LEAD = "admin@test.org", "lead@test.org"
QUEUED, RUNNER = "queued@test.org", "runner@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"},
         {"name": LEAD, "org": "test", "role": "lead"},
         {"name": QUEUED, "org": "test", "role": "lead"},
         {"name": RUNNER, "org": "test", "role": "lead"}]
SITES = ["site-1", "site-2"]
TERMINAL = ("FINISHED:COMPLETED", "FINISHED:FAILED", "FINISHED:ABORTED")
REVOKED = "the submitter's certificate was revoked"

# The job's server-side code: initial_model runs in the server worker before the first round.
MODEL = '''
import os
import numpy as np
from pathlib import Path

def make():
    mark = "{head}" + "{tail}"  # whole only when this runs: the job's own copy never holds it
    print(mark, flush=True)
    (Path(os.environ["ATOLL_WORKDIR"]) / (mark + ".ran")).write_text(mark)
    return {{"w": np.zeros(4, dtype=np.float32)}}
'''
APP_YAML = ("server:\n  workflow: scatter_gather\n  args: {num_rounds: 1, round_timeout: 600}\n"
            "  initial_model: model.py:make\nsite:\n  script: train.py\n")

# Stands in for a server parent whose bookkeeping an attacker controls: its own revocation
# checks (server/job_signer.py, as server/jobs.py calls them) always answer "not revoked".
UNCHECKED_SERVER = '''
import sys
if sys.argv[1:3] == ["server", "start"]:
    import atoll.server.jobs
    atoll.server.jobs.revoked_signer = lambda tree, held: None
'''


def _job(path: Path, mark: str, script: str = ECHO) -> Path:
    meta = {"name": path.name, "deploy_map": {"app": ["@ALL"]}}
    return job_folder(path, meta, APP_YAML, {"train.py": script,
                                              "model.py": MODEL.format(head=mark[:8],
                                                                       tail=mark[8:])})


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("revoke"), SITES, USERS)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def atoll(fed: Federation, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "atoll", *args], capture_output=True, text=True,
                          env={**os.environ, "ATOLL_HOME": str(fed.root / "admin-home")},
                          timeout=120)
    assert proc.returncode == 0, f"atoll {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def revoke(fed: Federation, user: str) -> str:
    """`atoll provision revoke` then `atoll crl push`, as the project admin does it."""
    atoll(fed, "provision", "revoke", str(fed.root), user, "--reason", "affiliation-changed")
    return atoll(fed, "crl", "push", str(fed.root / "ca" / "crl.pem"), "--kit",
                 str(fed.kit(ADMIN)))


def status(fed: Federation, job_id: str) -> dict:
    with fed.session(ADMIN) as s:
        return s.status(job_id)


def ran(fed: Federation, mark: str) -> list[str]:
    """Where the job's server-side code left its mark: files named or holding it, in the
    server's and the sites' workspaces and logs."""
    found = []
    for name in ["server", *SITES]:
        for folder, _, files in os.walk(fed.workspace(name)):
            for file in files:
                path = Path(folder, file)
                try:
                    if mark in file or (not path.is_symlink()
                                        and mark.encode() in path.read_bytes()):
                        found.append(str(path))
                except OSError:  # gone meanwhile, or a socket
                    pass
        if mark in fed.log(name):
            found.append(f"{name}.log")
    return found


def site_started(fed: Federation, job_id: str) -> list[str]:
    """The sites where a worker of the job was started (its run folder holds a worker log)."""
    return [s for s in SITES if (fed.workspace(s) / "jobs" / job_id / "logs").exists()
            and any((fed.workspace(s) / "jobs" / job_id / "logs").iterdir())]


def online(fed: Federation) -> set[str]:
    with fed.session(ADMIN) as s:
        return {x["name"] for x in s.sites()["sites"] if x["online"]}


@pytest.fixture(scope="module")
def cancelled(fed, tmp_path_factory):
    """QUEUED's job waits in the queue (site-2 is away) when QUEUED is revoked: (its id, its
    code's mark, what `atoll crl push` printed). The later tests put it back in the queue."""
    tmp = tmp_path_factory.mktemp("queued")
    mark = f"queued-initial-model-{secrets.token_hex(8)}"
    fed.kill("site-2")
    wait_for(lambda: "site-2" not in online(fed), 60, what="site-2 to go offline")
    with fed.session(QUEUED) as s:
        job_id = s.submit(_job(tmp / "queued", mark))["job_id"]
    wait_for(lambda: "waiting for sites" in status(fed, job_id)["reason"], 60,
             what="the job to wait for site-2")
    pushed = revoke(fed, QUEUED)
    fed.start_site("site-2")  # the queue frees
    fed.wait_online(ADMIN)
    wait_for(lambda: status(fed, job_id)["state"] in TERMINAL, 60, what="the queued job to end")
    return job_id, mark, pushed


def test_a_queued_job_of_a_revoked_user_is_cancelled_and_none_of_its_code_runs(
        fed, cancelled, tmp_path):
    job_id, mark, pushed = cancelled
    assert ran(fed, mark) == [], "the revoked user's initial_model ran"
    assert site_started(fed, job_id) == []
    assert job_id in pushed, pushed  # `atoll crl push` names the job it cancelled
    job = status(fed, job_id)
    assert job["state"] == "FINISHED:ABORTED", job
    assert job["reason"].startswith(f"cancelled: {REVOKED} (serial "), job
    assert "reason: affiliation-changed" in job["reason"], job
    for part in ("server", *SITES):
        assert job["parts"][part]["state"] == "FINISHED:ABORTED", job
        assert REVOKED in job["parts"][part]["reason"], job
    with fed.session(ADMIN) as s:
        listed = {j["job_id"]: j for j in s.list_jobs()}
    assert listed[job_id]["reason"] == job["reason"]  # `atoll job list` shows it too

    # the queue is free: a job queued behind it runs to its end, this one stays cancelled
    with fed.session(LEAD) as s:
        behind = s.submit(_job(tmp_path / "behind", f"behind-{secrets.token_hex(8)}"))["job_id"]
        assert s.wait(behind, timeout=180)["state"] == "FINISHED:COMPLETED"
    assert status(fed, job_id)["state"] == "FINISHED:ABORTED"
    assert ran(fed, mark) == [], "the revoked user's initial_model ran"
    assert not (fed.workspace("server") / "jobs" / job_id / "run").exists()


def test_a_queued_job_put_back_by_editing_the_job_store_is_cancelled_again(fed, cancelled):
    job_id, mark, _ = cancelled
    _requeue(fed, job_id)  # the real SQLite file, as whoever holds the server's disk edits it
    job = wait_for(lambda: (j := status(fed, job_id))["state"] in TERMINAL and j, 60,
                   what="the scheduler to take the job up again")
    assert ran(fed, mark) == [], "the revoked user's initial_model ran"
    assert site_started(fed, job_id) == []
    assert job["state"] == "FINISHED:ABORTED", job
    assert job["reason"].startswith(f"cancelled: {REVOKED}"), job  # not dispatched at all
    assert all(job["parts"][s]["reason"].startswith("cancelled") for s in SITES), job


def test_a_server_whose_queue_says_run_gets_a_server_worker_and_sites_that_refuse(
        fed, cancelled, tmp_path):
    job_id, mark, _ = cancelled
    patch = tmp_path / "unchecked"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(UNCHECKED_SERVER)
    fed.kill("server")
    _requeue(fed, job_id)
    fed.start_server(env={"PYTHONPATH": str(patch)})
    try:
        fed.wait_online(ADMIN, timeout=60)
        job = wait_for(lambda: (j := status(fed, job_id))["state"] in TERMINAL and j, 120,
                       what="the dispatched job to end")
        assert ran(fed, mark) == [], "the revoked user's initial_model ran"
        assert site_started(fed, job_id) == []
        server = job["parts"]["server"]["reason"]
        assert job["parts"]["server"]["state"] == "FINISHED:FAILED", job
        assert "the server worker refused to run the job" in server, job
        assert f"{QUEUED} that signed the job is revoked" in server, job
        assert "affiliation-changed" in server, job
        for site in SITES:
            reason = job["parts"][site]["reason"]
            assert f"{site} refused the job" in reason and "is revoked" in reason, job
    finally:
        fed.kill("server")
        fed.start_server()
        fed.wait_online(ADMIN, timeout=60)


def test_a_running_job_of_a_revoked_user_is_aborted_at_the_server_and_its_sites(fed, tmp_path):
    mark = f"running-initial-model-{secrets.token_hex(8)}"
    with fed.session(RUNNER) as s:
        job_id = s.submit(_job(tmp_path / "running", mark, script=STALL))["job_id"]
    wait_for(lambda: all(status(fed, job_id)["parts"][p]["state"] == "RUNNING"
                         for p in ("server", *SITES)), 120, what="the job to run everywhere")
    wait_for(lambda: pids_with_env(f"ATOLL_JOB_ID={job_id}"), 30, what="its workers")

    revoke(fed, RUNNER)
    job = wait_for(lambda: (j := status(fed, job_id))["state"] in TERMINAL and j, 120,
                   what="the running job to end")
    assert job["state"] == "FINISHED:ABORTED", job
    assert job["reason"].startswith(f"aborted: {REVOKED} (serial "), job
    for part in ("server", *SITES):
        assert job["parts"][part]["state"] == "FINISHED:ABORTED", job
        assert "revoked" in job["parts"][part]["reason"], job
    wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={job_id}"), 60,
             what="the job's workers to exit")


def _requeue(fed: Federation, job_id: str) -> None:
    """Put the job back in the queue in the server's job store (atoll.db), every part too."""
    with sqlite3.connect(fed.workspace("server") / "atoll.db", timeout=30) as db:
        db.execute("UPDATE jobs SET state='SUBMITTED', reason='' WHERE id=?", (job_id,))
        db.execute("UPDATE parts SET state='SUBMITTED', reason='' WHERE job_id=?", (job_id,))
