"""A federated job over one Slurm site and one process site (marker: slurm).

The server and both site parents are real processes with mutual TLS. The Slurm site submits its
worker with sbatch to the real test cluster; the worker, on a Slurm node, dials its parent's
worker endpoint (127.0.0.1 here, where the nodes run) and exchanges tasks through it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from tests.integration.federation.ddp_jobs import check_ddp_rounds, make_ddp_job, rank_records
from tests.integration.federation.harness import Federation, pids_with_env, wait_for
from tests.integration.federation.jobs import make_job
from tests.integration.slurm.conftest import BASE, PYTHON

pytestmark = pytest.mark.slurm

ADMIN = "admin@slurm.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]


@pytest.fixture(scope="module")
def slurm_federation(slurm_cluster, tmp_path_factory):
    # A study secret at the Slurm site: the multi-node tests check that rank 0 alone gets it.
    runtime = {"site-s": "format_version: 2\nstudies:\n  default:\n    secret_env:\n"
                         "      DDP_SECRET: {source: env, key: ATOLL_TEST_DDP_SECRET}\n"}
    fed = Federation.provisioned(tmp_path_factory.mktemp("slurm-fed"), ["site-p", "site-s"],
                                 USERS, runtime=runtime)
    site_yaml = {"launcher": "slurm",
                 "slurm": {"python_path": PYTHON, "pending_timeout": 120},
                 "worker_endpoint": {"host": "127.0.0.1", "port": 0}}
    (fed.kit("site-s") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    fed.start_server()
    fed.start_site("site-p")
    fed.start_site("site-s", env={"SLURM_CONF": str(BASE / "etc" / "slurm.conf"),
                                  "ATOLL_TEST_DDP_SECRET": "s3cr3t"})
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def test_a_job_completes_over_a_slurm_site_and_a_process_site(slurm_federation, tmp_path):
    job_dir = make_job(tmp_path / "slurm-echo", rounds=2)
    meta = json.loads((job_dir / "meta.json").read_text())
    meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "1Gi"}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    with slurm_federation.session(ADMIN) as session:
        job = session.submit(job_dir, wait=True, timeout=240)
    assert job["state"] == "FINISHED:COMPLETED", (job, slurm_federation.log("site-s"))
    assert job["parts"]["site-s"]["state"] == "FINISHED:COMPLETED"
    # The worker really ran as a Slurm job: accounting knows it by the atoll job's id (slurmdbd
    # records a finished job a moment later, so ask a few times).
    env = {"SLURM_CONF": str(BASE / "etc" / "slurm.conf"), "PATH": "/usr/bin:/bin"}
    deadline = time.monotonic() + 20
    while True:
        accounted = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "JobName,State", "-S", "now-1hours"],
            capture_output=True, text=True, env=env).stdout
        if f"atoll-site-s-{job['job_id']}|COMPLETED" in accounted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert f"atoll-site-s-{job['job_id']}|COMPLETED" in accounted, accounted


SLURM_DDP = {"launcher_spec": {"site-s": {"slurm": {"nodes": 2}}},
             "resource_spec": {"@default": {"num_of_cpus": 1, "memory": "1Gi"},
                               "site-s": {"num_of_cpus": 2, "memory": "3Gi"}}}


def test_a_two_node_ddp_site_federates_with_a_process_site(slurm_federation, tmp_path):
    """The Slurm site trains with one DDP rank on each of n1 and n2 (gloo, CPU); rank 0 alone
    holds the link to the parent; FedAvg runs three rounds with the process site."""
    job_dir = make_ddp_job(tmp_path / "slurm-ddp", ["site-p", "site-s"], rounds=3, **SLURM_DDP)
    with slurm_federation.session(ADMIN) as session:
        job = session.submit(job_dir, wait=True, timeout=300)
    assert job["state"] == "FINISHED:COMPLETED", (job, slurm_federation.log("site-s"))
    folder = slurm_federation.workspace("site-s") / "jobs" / job["job_id"]
    records = rank_records(folder)
    check_ddp_rounds(records, world=2, rounds=3)
    assert {records[0][0]["host"], records[1][0]["host"]} == {"n1", "n2"}, records
    # The study's secret reached rank 0 only (the job token: check_ddp_rounds).
    assert [records[r][0]["secret"] for r in (0, 1)] == [True, False]
    # Only rank 0 registered: one worker session at the site for the job's one token.
    log = next((folder / "logs").glob("slurm-*.out")).read_text()
    assert log.count("registered with") == 1, log
    assert "0: atoll worker: job" in log
    single = rank_records(slurm_federation.workspace("site-p") / "jobs" / job["job_id"])
    assert list(single) == [0]


def test_two_gpus_on_one_slurm_node_run_two_ranks_with_one_gpu_each(slurm_federation, tmp_path):
    """More than one GPU per node: one srun task per GPU (fake GPUs of the test cluster), each
    rank sees only its own."""
    spec = {"resource_spec": {"@default": {"num_of_cpus": 1, "memory": "1Gi"},
                              "site-s": {"num_of_cpus": 2, "memory": "3Gi", "num_of_gpus": 2}},
            "launcher_spec": {"site-s": {"slurm": {"processes_per_node": 2}}}}
    job_dir = make_ddp_job(tmp_path / "slurm-gpus", ["site-p", "site-s"], rounds=2, **spec)
    with slurm_federation.session(ADMIN) as session:
        job = session.submit(job_dir, wait=True, timeout=300)
    assert job["state"] == "FINISHED:COMPLETED", (job, slurm_federation.log("site-s"))
    records = rank_records(slurm_federation.workspace("site-s") / "jobs" / job["job_id"])
    check_ddp_rounds(records, world=2, rounds=2)
    assert records[0][0]["host"] == records[1][0]["host"]  # one node, two tasks
    assert [records[r][0]["local_rank"] for r in (0, 1)] == [0, 1]
    gpus = [records[r][0]["gpus"] for r in (0, 1)]
    assert all(g is not None and "," not in g for g in gpus) and gpus[0] != gpus[1], gpus


def test_a_slurm_rank_killed_mid_round_fails_the_site_and_leaves_no_process(
        slurm_federation, tmp_path):
    job_dir = make_ddp_job(tmp_path / "slurm-ddp-kill", ["site-p", "site-s"], rounds=2,
                           config={"stall_rank": 1}, **SLURM_DDP)
    with slurm_federation.session(ADMIN) as s:
        job_id = s.submit(job_dir)["job_id"]
        ranks = slurm_federation.workspace("site-s") / "jobs" / job_id / "ranks"
        wait_for(lambda: (ranks / "pid-0").exists() and (ranks / "pid-1").exists(), 180,
                 "both Slurm ranks in the round")
        os.kill(int((ranks / "pid-1").read_text()), signal.SIGKILL)  # bare sandbox: host pids
        killed = time.monotonic()
        part = wait_for(lambda: (p := s.status(job_id)["parts"]["site-s"])["state"]
                        .startswith("FINISHED") and p, 30, "the Slurm site's part to end")
        noticed = time.monotonic() - killed
        s.abort(job_id)
        s.wait(job_id, timeout=60)
    assert part["state"] == "FINISHED:FAILED", part
    assert "rank 1 on n2 failed first: Killed" in part["reason"], part
    print(f"Slurm site part failed {noticed:.2f} s after rank 1 was killed: {part['reason']}")
    wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={job_id}", sandboxes=True), 15,
             "every process of the job gone, on both nodes")


def test_the_server_workers_results_come_home_from_its_batch_job(slurm_cluster, tmp_path):
    """The server's own worker as a Slurm job: what the workflow writes reaches `atoll job
    download` (issue 36: results come home from every launcher)."""
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS)
    server_yaml = {"launcher": "slurm", "slurm": {"python_path": PYTHON, "pending_timeout": 120},
                   "worker_endpoint": {"host": "127.0.0.1", "port": 0}}
    (fed.kit("server") / "local" / "site.yaml").write_text(yaml.safe_dump(server_yaml))
    fed.start_server(env={"SLURM_CONF": str(BASE / "etc" / "slurm.conf")})
    fed.start_site("site-1")
    try:
        fed.wait_online(ADMIN)
        job_dir = make_job(tmp_path / "server-as-a-batch-job", rounds=2)
        meta = json.loads((job_dir / "meta.json").read_text())
        meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "1Gi"}}
        (job_dir / "meta.json").write_text(json.dumps(meta))
        with fed.session(ADMIN) as session:
            job = session.submit(job_dir, wait=True, timeout=240)
            out = session.download(job["job_id"], tmp_path / "download")
    finally:
        fed.stop_all()
    assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"], fed.log("server"))
    report = json.loads((out / "results" / "scatter_gather.json").read_text())
    assert len(report["rounds"]) == 2, report


def test_an_apptainer_sites_launch_entry_names_its_images_sha256(slurm_cluster, tmp_path):
    """A Slurm site whose workers run in Apptainer: its signed launch entry names the image
    file and its SHA-256 as the site parent read it, and the record verifies offline. (This
    host has no apptainer command, so the batch job itself fails on its node: the entry is
    made once sbatch took the job.)"""
    import hashlib
    import shutil

    from tests.integration.federation.provenance_check import verified_launch_entry

    image = tmp_path / "worker.sif"
    image.write_bytes(b"SIF test image " + os.urandom(4096))
    fed = Federation.provisioned(tmp_path / "fed", ["site-s"], USERS)
    site_yaml = {"launcher": "slurm",
                 "slurm": {"python_path": PYTHON, "pending_timeout": 120,
                           "sandbox": "apptainer", "container_image": str(image)},
                 "worker_endpoint": {"host": "127.0.0.1", "port": 0}}
    (fed.kit("site-s") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    job_dir = make_job(tmp_path / "apptainer-echo", rounds=1)
    fed.start_server()
    fed.start_site("site-s", env={"SLURM_CONF": str(BASE / "etc" / "slurm.conf")})
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as session:
            job = session.submit(job_dir, wait=True, timeout=240)
        if shutil.which("apptainer") is not None:
            assert job["state"] == "FINISHED:COMPLETED", (job, fed.log("site-s"))
        launch = verified_launch_entry(fed, ADMIN, job["job_id"], "site-s", tmp_path)
    finally:
        fed.stop_all()
    assert launch["launcher"] == "slurm" and launch["image"] == str(image), launch
    assert launch["image_digest"] == "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
