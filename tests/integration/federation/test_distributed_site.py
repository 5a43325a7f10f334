"""A site that trains with two processes (DDP, gloo, CPU) in a real federation.

The server and both site parents are real processes with mutual TLS; ``site-ddp`` runs the
process launcher with two fake GPU ids, so a job asking two GPUs there runs two ranks in one
sandbox, each seeing one id; ``site-one`` runs one process. Only rank 0 holds the job's link.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.ddp_jobs import check_ddp_rounds, make_ddp_job, rank_records
from tests.integration.federation.harness import Federation, pids_with_env, wait_for

GPU_IDS = ["7", "9"]
RESOURCES = {"@default": {"num_of_cpus": 1},
             "site-ddp": {"num_of_cpus": 2, "num_of_gpus": 2}}
RANKS = {"site-ddp": {"process": {"processes_per_node": 2}}}  # one per GPU: the job asks them


@pytest.fixture(scope="module")
def ddp_federation(tmp_path_factory):
    # The study's secret (like the job token) is rank 0's alone.
    runtime = {"site-ddp": "format_version: 2\nstudies:\n  default:\n    secret_env:\n"
                           "      DDP_SECRET: {source: env, key: ATOLL_TEST_DDP_SECRET}\n"}
    fed = Federation.provisioned(tmp_path_factory.mktemp("ddp-fed"), ["site-ddp", "site-one"],
                                 USERS, runtime=runtime)
    site_yaml = fed.kit("site-ddp") / "local" / "site.yaml"
    config = yaml.safe_load(site_yaml.read_text()) if site_yaml.exists() else {}
    config = {**(config or {}), "launcher": "process"}
    config["process"] = {**(config.get("process") or {}), "gpu_ids": GPU_IDS}
    site_yaml.write_text(yaml.safe_dump(config))
    fed.start_server()
    fed.start_site("site-ddp", env={"ATOLL_TEST_DDP_SECRET": "s3cr3t"})
    fed.start_site("site-one")
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def run_folder(fed: Federation, site: str, job_id: str) -> Path:
    return fed.workspace(site) / "jobs" / job_id


def test_a_two_process_site_federates_with_one_gpu_per_rank(ddp_federation, tmp_path):
    job_dir = make_ddp_job(tmp_path / "ddp", ["site-ddp", "site-one"], rounds=3,
                           resource_spec=RESOURCES, launcher_spec=RANKS)
    with ddp_federation.session(ADMIN) as session:
        job = session.submit(job_dir, wait=True, timeout=240)
    assert job["state"] == "FINISHED:COMPLETED", (job, ddp_federation.log("site-ddp"))
    records = rank_records(run_folder(ddp_federation, "site-ddp", job["job_id"]))
    check_ddp_rounds(records, world=2, rounds=3)
    # Each process saw exactly one GPU id, its own.
    assert {r["gpus"] for r in records[0]} == {GPU_IDS[0]}
    assert {r["gpus"] for r in records[1]} == {GPU_IDS[1]}
    assert [r["local_rank"] for r in records[1]] == [1, 1, 1]
    # The study's secret reached rank 0 only (the job token: check_ddp_rounds).
    assert {r["secret"] for r in records[0]} == {True}
    assert {r["secret"] for r in records[1]} == {False}
    # The single-process site is rank 0 of 1 and saw no GPU.
    single = rank_records(run_folder(ddp_federation, "site-one", job["job_id"]))
    assert list(single) == [0] and {r["world_size"] for r in single[0]} == {1}
    assert {r["gpus"] for r in single[0]} == {""}


def _rank_pid(job_id: str, rank: int) -> int | None:
    for pid in pids_with_env(f"ATOLL_JOB_ID={job_id}"):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"ATOLL_SITE=site-ddp" in env:
            return pid
    return None


def test_a_rank_killed_mid_round_fails_the_site_and_leaves_no_process(ddp_federation, tmp_path):
    job_dir = make_ddp_job(tmp_path / "ddp-kill", ["site-ddp", "site-one"], rounds=2,
                           resource_spec=RESOURCES, launcher_spec=RANKS, config={"stall_rank": 1})
    with ddp_federation.session(ADMIN) as s:
        job_id = s.submit(job_dir)["job_id"]
        folder = run_folder(ddp_federation, "site-ddp", job_id)
        wait_for(lambda: (folder / "ranks" / "pid-1").exists() and (folder / "ranks" / "pid-0")
                 .exists(), 120, "both ranks in the round")
        victim = _rank_pid(job_id, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        part = wait_for(lambda: (p := s.status(job_id)["parts"]["site-ddp"])["state"]
                        .startswith("FINISHED") and p, 30, "the site's part to end")
        noticed = time.monotonic() - killed
        s.abort(job_id)
        s.wait(job_id, timeout=60)
    assert part["state"] == "FINISHED:FAILED", part
    assert "rank 1 was killed by signal 9 (SIGKILL)" in part["reason"], part
    print(f"site part failed {noticed:.2f} s after rank 1 was killed")
    wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={job_id}", sandboxes=True), 15,
             "every process of the job gone")


def test_a_rank_that_raises_fails_the_site_with_its_error(ddp_federation, tmp_path):
    job_dir = make_ddp_job(tmp_path / "ddp-raise", ["site-ddp", "site-one"], rounds=2,
                           resource_spec=RESOURCES, launcher_spec=RANKS, config={"raise_rank": 1})
    with ddp_federation.session(ADMIN) as s:
        job_id = s.submit(job_dir)["job_id"]
        part = wait_for(lambda: (p := s.status(job_id)["parts"]["site-ddp"])["state"]
                        .startswith("FINISHED") and p, 120, "the site's part to end")
        s.abort(job_id)
        s.wait(job_id, timeout=60)
        logs = s.logs(job_id)["logs"]
    assert part["state"] == "FINISHED:FAILED", part
    assert part["reason"] == ("rank 1 exited with code 1: RuntimeError: rank 1 broke on purpose"), part
    assert "Traceback" in logs["site-ddp"] and "broke on purpose" in logs["site-ddp"]
    wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={job_id}", sandboxes=True), 15,
             "every process of the job gone")


@pytest.mark.parametrize("framework", ["torch-ddp", "lightning"])
def test_the_ranked_templates_federate_with_two_processes_per_site(ddp_federation, tmp_path,
                                                                   framework):
    """`atoll job init --framework torch-ddp|lightning`, submitted as written: both sites train
    with two ranks (CPU, gloo) through the job's FedAvg rounds and its final cross-site
    evaluation; Lightning's DDP runs on the ranks the launcher started."""
    from click.testing import CliRunner

    from atoll.cli.job_init import init_command

    job_dir = tmp_path / framework
    done = CliRunner().invoke(init_command, [str(job_dir), "--framework", framework])
    assert done.exit_code == 0, done.output
    with ddp_federation.session(ADMIN) as session:
        job = session.submit(job_dir, wait=True, timeout=300)
        logs = session.logs(job["job_id"])["logs"]
    assert job["state"] == "FINISHED:COMPLETED", (job, logs)
    for site in ("site-ddp", "site-one"):
        assert f"{site}: rank 0 of 2 on cpu" in logs[site], logs[site]
        assert f"{site}: rank 1 of 2 on cpu" in logs[site], logs[site]
        if framework == "torch-ddp":
            assert f"{site} round 5:" in logs[site], logs[site]
