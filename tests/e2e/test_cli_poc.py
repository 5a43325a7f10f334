"""The CLI as a user types it: a local federation, a job from the template, its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture
def cli(tmp_path):
    env = {**os.environ, "ATOLL_HOME": str(tmp_path / "home"),
           "ATOLL_POC_WORKSPACE": str(tmp_path / "poc")}

    def run(*args, check=True, cwd=tmp_path):
        proc = subprocess.run([sys.executable, "-m", "atoll", *args], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"atoll {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    yield run
    run("poc", "down", check=False)


def test_poc_job_init_submit_download(cli, tmp_path):
    up = cli("poc", "up", "--sites", "2")
    assert "federation up" in up.stdout
    sites = json.loads(cli("site", "list", "--format", "json").stdout)
    assert {s["name"]: s["online"] for s in sites["sites"]} == {"site-1": True, "site-2": True}
    cli("job", "init", "myjob")
    submitted = cli("job", "submit", "myjob", "--wait")
    assert "FINISHED:COMPLETED" in submitted.stdout
    jobs = json.loads(cli("job", "list", "--format", "json").stdout)
    assert len(jobs) == 1 and jobs[0]["state"] == "FINISHED:COMPLETED"
    job_id = jobs[0]["job_id"]
    status = cli("job", "status", job_id)
    assert "site-1" in status.stdout and "FINISHED:COMPLETED" in status.stdout
    assert "==> server <==" in cli("job", "logs", job_id).stdout
    cli("job", "download", job_id, "--out", str(tmp_path / "dl"))
    assert (tmp_path / "dl" / job_id / "job.json").exists()
    down = cli("poc", "down")
    assert "stopped 3 parent(s)" in down.stdout


def test_errors_are_sentences_not_tracebacks(cli, tmp_path):
    missing = cli("job", "list", check=False)
    assert missing.returncode == 2
    assert "no admin kit" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "badjob").mkdir()
    (tmp_path / "badjob" / "meta.json").write_text('{"name": "x", "deploy_map": {}}')
    cli("poc", "up", "--sites", "1")
    bad = cli("job", "submit", "badjob", check=False)
    assert bad.returncode == 2
    assert "deploy_map" in bad.stderr and "Traceback" not in bad.stderr
    unknown = cli("job", "status", "0" * 32, check=False)
    assert unknown.returncode == 5 and "no such job" in unknown.stderr
    cli("poc", "down")
    offline = cli("job", "list", check=False)
    assert offline.returncode in (2, 3)
    assert "Traceback" not in offline.stderr


def test_starting_a_parent_in_the_foreground_checks_its_kit_first(cli, tmp_path):
    cli("poc", "up", "--sites", "1")
    poc = tmp_path / "poc" / "poc"
    twice = cli("server", "start", str(poc / "server"), check=False)
    assert twice.returncode == 2 and "already runs" in twice.stderr
    wrong = cli("site", "start", str(poc / "server"), check=False)
    assert wrong.returncode == 2 and "is a server kit" in wrong.stderr
    missing = cli("site", "start", str(tmp_path / "nowhere"), check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    for proc in (twice, wrong, missing):
        assert "Traceback" not in proc.stderr
