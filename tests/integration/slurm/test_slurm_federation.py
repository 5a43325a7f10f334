"""A federated job over one Slurm site and one process site (marker: slurm).

The server and both site parents are real processes with mutual TLS. The Slurm site submits its
worker with sbatch to the real test cluster; the worker, on a Slurm node, dials its parent's
worker endpoint (127.0.0.1 here, where the nodes run) and exchanges tasks through it.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job
from tests.integration.slurm.conftest import BASE, PYTHON

pytestmark = pytest.mark.slurm

ADMIN = "admin@slurm.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]


@pytest.fixture(scope="module")
def slurm_federation(slurm_cluster, tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("slurm-fed"), ["site-p", "site-s"],
                                 USERS)
    site_yaml = {"launcher": "slurm",
                 "slurm": {"python_path": PYTHON, "pending_timeout": 120},
                 "worker_endpoint": {"host": "127.0.0.1", "port": 0}}
    (fed.kit("site-s") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    fed.start_server()
    fed.start_site("site-p")
    fed.start_site("site-s", env={"SLURM_CONF": str(BASE / "etc" / "slurm.conf")})
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
