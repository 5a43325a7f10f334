"""Backup and restore on a real federation (docs/operations.md, Backup and restore): a backup
taken with `atoll server backup` while the server runs, restored with `atoll server restore`
into a fresh copy of the server's kit, gives a server that lists the same jobs, studies and
revoked certificates, still serves the old job's results, and completes a new job."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from atoll.admin.errors import AuthError
from tests.integration.federation.harness import Federation, wait_for
from tests.integration.federation.jobs import make_job

ADMIN, LEAD, LEAVER = "admin@test.org", "lead@test.org", "leaver@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"},
         {"name": LEAD, "org": "test", "role": "lead"},
         {"name": LEAVER, "org": "test", "role": "lead"}]
STUDIES = {"trial": {"sites": ["site-1", "site-2"], "admins": [LEAD, LEAVER]}}
RUNTIME = "format_version: 2\nstudies:\n  trial: {}\n  later: {}\n"


def atoll(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "atoll", *args], capture_output=True, text=True,
                          env={**os.environ, "ATOLL_HOME": str(home)}, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"atoll {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), ["site-1", "site-2"], USERS,
                                 STUDIES, runtime={s: RUNTIME for s in ("site-1", "site-2")})
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def state(fed: Federation, home: Path) -> dict:
    """What the restored server must show again: jobs, studies, the revocation list."""
    with fed.session(LEAD, study="trial") as s:
        jobs = sorted((j["job_id"], j["name"], j["state"]) for j in s.list_jobs())
    with fed.session(ADMIN) as s:
        studies = {x["name"]: sorted(x["sites"]) for x in s.call("study_list")["studies"]}
    crl = json.loads(atoll("crl", "show", "--kit", str(fed.kit(ADMIN)), "--format", "json",
                           home=home).stdout)
    return {"jobs": jobs, "studies": studies, "crl": crl}


def test_a_backup_of_a_running_server_restored_in_a_fresh_folder_keeps_its_state(
        federation, tmp_path):
    fed, home = federation, tmp_path / "home"
    with fed.session(LEAD, study="trial") as s:
        done = s.submit(make_job(tmp_path / "before"), wait=True, timeout=180)
    assert done["state"] == "FINISHED:COMPLETED", done
    with fed.session(ADMIN) as s:
        s.call("study_create", name="later", sites=["site-1"], users=[LEAD])
    atoll("provision", "revoke", str(fed.root), LEAVER, "--reason", "superseded", home=home)
    atoll("crl", "push", str(fed.root / "ca" / "crl.pem"), "--kit", str(fed.kit(ADMIN)),
          home=home)
    before = state(fed, home)
    assert [j[0] for j in before["jobs"]] == [done["job_id"]]
    assert set(before["studies"]) >= {"trial", "later"}
    assert before["crl"]["number"] >= 1 and before["crl"]["revoked"], before["crl"]

    # taken while the server runs; private, and it names what it holds
    out = tmp_path / "backup"
    taken = atoll("server", "backup", str(fed.kit("server")), str(out), "--format", "json",
                  home=home)
    assert json.loads(taken.stdout)["files"] >= 4, taken.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for name in ("atoll.db", "session.key", "crl.pem", "backup.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    again = atoll("server", "backup", str(fed.kit("server")), str(out), home=home, check=False)
    assert again.returncode == 2 and "exists already" in again.stderr, again.stderr

    # the server's host is lost: a fresh copy of its kit, as provisioned, gets the backup
    refused = atoll("server", "restore", str(out), str(fed.kit("server")), home=home,
                    check=False)
    assert refused.returncode == 2 and "runs (pid" in refused.stderr, refused.stderr
    fed.kill("server")
    lost = fed.root / "server-lost"
    fed.kit("server").rename(lost)
    shutil.copytree(lost, fed.kit("server"), ignore=shutil.ignore_patterns("workspace"))
    restored = atoll("server", "restore", str(out), str(fed.kit("server")), home=home)
    assert "restored" in restored.stdout
    twice = atoll("server", "restore", str(out), str(fed.kit("server")), home=home, check=False)
    assert twice.returncode == 2 and "has state of its own" in twice.stderr, twice.stderr

    fed.start_server()
    fed.wait_online(ADMIN, timeout=60)
    assert state(fed, home) == before
    with pytest.raises(AuthError, match="revoked"):
        fed.session(LEAVER, study="trial").list_jobs()
    with fed.session(LEAD, study="trial") as s:
        results = s.download(done["job_id"], tmp_path / "results")
        assert any(results.rglob("*")), "the old job's results are served again"
        new = s.submit(make_job(tmp_path / "after"), wait=True, timeout=180)
    assert new["state"] == "FINISHED:COMPLETED", new
    assert new["job_id"] != done["job_id"]
    wait_for(lambda: len(state(fed, home)["jobs"]) == 2, 30, what="both jobs listed")
