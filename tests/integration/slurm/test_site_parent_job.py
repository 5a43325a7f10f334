"""A site parent that is itself a Slurm job (deploy/slurm/atoll-site.sbatch), on the real Slurm of
scripts/backends/slurm.sh: for sites whose login nodes allow no daemons (marker: slurm).

The first allocation queues its successor (dependency singleton), runs `atoll site start` and
submits the site's job worker with sbatch from inside the allocation: a federated job completes.
Then the allocation reaches its time limit: Slurm signals the batch shell, the parent stops in
order, and while no allocation runs a second job is submitted (the successor is held until the
server has seen the site go, so that the job is really submitted meanwhile). Released, the
successor starts the same site from the same shared kit and workspace, and the waiting job runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job, round_taker
from tests.integration.slurm.conftest import PYTHON, REPO

pytestmark = pytest.mark.slurm

ADMIN = "admin@slurm-parent.test"
SITE = "site-sp"
SBATCH_SCRIPT = REPO / "deploy" / "slurm" / "atoll-site.sbatch"
STOP_BEFORE = 20  # seconds: a 1-minute allocation signals its parent after ~40 s


def _squeue(name: str) -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i|%T"], capture_output=True,
                         text=True, check=True).stdout
    return [tuple(line.split("|")) for line in out.split()]  # type: ignore[misc]


def _wait(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {seconds} s")
        time.sleep(0.5)
    return value


def _online(fed: Federation) -> bool:
    with fed.session(ADMIN) as session:
        return any(s["name"] == SITE and s["online"] for s in session.sites()["sites"])


def _small_job(path: Path) -> Path:
    job_dir = make_job(path)
    meta = json.loads((job_dir / "meta.json").read_text())
    meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "512Mi"}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    return job_dir


def test_site_parent_as_a_slurm_job_resumes_in_its_next_allocation(slurm_cluster, tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", [SITE],
                                 [{"name": ADMIN, "org": "test", "role": "project_admin"}])
    site_yaml = {"launcher": "slurm", "slurm": {"python_path": PYTHON, "pending_timeout": 120},
                 "worker_endpoint": {"host": "__NODE_ADDRESS__", "port": 0}}
    # Each allocation writes site.yaml from this, naming its node (here: the nodes' 127.0.0.1).
    (fed.kit(SITE) / "local" / "site.yaml.in").write_text(yaml.safe_dump(site_yaml))
    name = f"atoll-site-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ATOLL": str(Path(PYTHON).parent / "atoll"),
           "ATOLL_STOP_BEFORE": str(STOP_BEFORE), "ATOLL_NODE_ADDRESS": "127.0.0.1"}
    fed.start_server()
    try:
        first = subprocess.run(
            ["sbatch", "--parsable", f"--job-name={name}", "--time=1", "--mem=400M",
             f"--signal=B:TERM@{STOP_BEFORE}", f"--chdir={tmp_path}", str(SBATCH_SCRIPT),
             str(fed.kit(SITE))], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
        log = tmp_path / f"atoll-site-{name}.log"
        _wait(lambda: _online(fed), 60, f"the site online from job {first}")
        jobs = dict(_squeue(name))
        successor = next(j for j in jobs if j != first)
        assert jobs == {first: "RUNNING", successor: "PENDING"}, jobs
        with fed.session(ADMIN) as session:
            job = session.submit(_small_job(tmp_path / "in-first"), wait=True, timeout=120)
        assert job["state"] == "FINISHED:COMPLETED", (job, log.read_text())

        # The first allocation nears its limit; the successor waits until we have submitted.
        subprocess.run(["scontrol", "hold", successor], check=True, env=env)
        _wait(lambda: first not in dict(_squeue(name)), 150, f"the end of job {first}")
        assert f"job {first}: SIGTERM (the time limit nears, or scancel)" in log.read_text()
        assert not _online(fed)
        with fed.session(ADMIN) as session:
            waiting = session.submit(_small_job(tmp_path / "meanwhile"))["job_id"]
        subprocess.run(["scontrol", "release", successor], check=True, env=env)
        _wait(lambda: dict(_squeue(name)).get(successor) == "RUNNING", 60, "the successor")
        with fed.session(ADMIN) as session:
            done = session.wait(waiting, timeout=180)
        assert done["state"] == "FINISHED:COMPLETED", (done, log.read_text())
        text = log.read_text()
        assert f"job {successor}: starting the site parent" in text
        assert f"job {first}: site parent exited 0" in text
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, env=env)
        fed.stop_all()
    _wait(lambda: not _squeue(name), 60, "no allocation of the site parent left")


def test_the_successor_keeps_the_partition_account_and_qos(slurm_cluster, tmp_path):
    """A parent submitted to a non-default account and QoS queues its successor under the same
    ones (it used to fall back to the user's defaults)."""
    fake = tmp_path / "atoll"  # stands for `atoll site start`: keeps the allocation a while
    fake.write_text("#!/bin/sh\nexec sleep 120\n")
    fake.chmod(0o755)
    kit = tmp_path / "kit"
    (kit / "local").mkdir(parents=True)
    name = f"atoll-site-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ATOLL": str(fake)}
    try:
        first = subprocess.run(
            ["sbatch", "--parsable", f"--job-name={name}", "--time=2", "--mem=100M",
             "--partition=gpu", "--account=other", "--qos=high", f"--chdir={tmp_path}",
             str(SBATCH_SCRIPT), str(kit)], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
        successor = _wait(lambda: next((j for j, _ in _squeue(name) if j != first), None), 60,
                          "the successor queued")
        fields = subprocess.run(["squeue", "-h", "-j", f"{first},{successor}", "-o",
                                 "%i %P %a %q %l"], capture_output=True, text=True,
                                check=True).stdout.split("\n")
        seen = {line.split()[0]: line.split()[1:] for line in fields if line.strip()}
        assert seen[successor] == seen[first] == ["gpu", "other", "high", "2:00"], seen
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, env=env)
    _wait(lambda: not _squeue(name), 60, "no allocation of the site parent left")


SLOW = round_taker(3.0)


def test_a_job_running_when_the_allocation_ends_is_finished_by_the_successor(slurm_cluster,
                                                                             tmp_path):
    """Issue 37: the parent's SIGTERM at its allocation's end leaves the job's worker (a Slurm
    job of its own) running; the successor, started on the end of the first, takes it back and
    the job completes, each round once, none trained twice."""
    fed = Federation.provisioned(tmp_path / "fed", [SITE],
                                 [{"name": ADMIN, "org": "test", "role": "project_admin"}])
    site_yaml = {"launcher": "slurm", "slurm": {"python_path": PYTHON, "pending_timeout": 120},
                 "worker_endpoint": {"host": "__NODE_ADDRESS__", "port": 0}}
    (fed.kit(SITE) / "local" / "site.yaml.in").write_text(yaml.safe_dump(site_yaml))
    name = f"atoll-site-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ATOLL": str(Path(PYTHON).parent / "atoll"),
           "ATOLL_STOP_BEFORE": str(STOP_BEFORE), "ATOLL_NODE_ADDRESS": "127.0.0.1"}
    fed.start_server()
    rounds = 25  # 3 s each: longer than what is left of the first allocation
    try:
        first = subprocess.run(
            ["sbatch", "--parsable", f"--job-name={name}", "--time=1", "--mem=400M",
             f"--signal=B:TERM@{STOP_BEFORE}", f"--chdir={tmp_path}", str(SBATCH_SCRIPT),
             str(fed.kit(SITE))], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
        log = tmp_path / f"atoll-site-{name}.log"
        _wait(lambda: _online(fed), 60, f"the site online from job {first}")
        job_dir = make_job(tmp_path / "long", script=SLOW, rounds=rounds)
        meta = json.loads((job_dir / "meta.json").read_text())
        meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "512Mi"}}
        (job_dir / "meta.json").write_text(json.dumps(meta))
        with fed.session(ADMIN) as session:
            job_id = session.submit(job_dir)["job_id"]
        _wait(lambda: first not in dict(_squeue(name)), 150, f"the end of job {first}")
        with fed.session(ADMIN) as session:
            assert not session.status(job_id)["state"].startswith("FINISHED"), \
                "the job ended before the allocation did: make it longer"
            done = session.wait(job_id, timeout=300)
            text = log.read_text()
            assert done["state"] == "FINISHED:COMPLETED", (done, text[-4000:])
            assert "its workers wait 300 s for the next one" in text, text[-4000:]
            assert "took back the worker an earlier site parent left" in text, text[-4000:]
            result = json.loads(next(session.download(job_id, tmp_path / "results").rglob(
                "scatter_gather.json")).read_text())
            assert [sorted(r["replies"]) for r in result["rounds"]] == [[SITE]] * rounds
        out = "".join(p.read_text(errors="replace") for p in
                      (fed.workspace(SITE) / "jobs" / job_id / "logs").glob("*"))
        assert "rejoined its restarted site parent" in out, out[-3000:]
        assert all(out.count(f"took round {r} ") + out.count(f"took round {r}\n") == 1
                   for r in range(1, rounds + 1)), out[-3000:]
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, env=env)
        fed.stop_all()
    _wait(lambda: not _squeue(name), 60, "no allocation of the site parent left")
