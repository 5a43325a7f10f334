"""A Slurm site parent `kill -9`'d mid-round and started again (issue 37 item 3, marker: slurm):
its worker, a Slurm job of the real test cluster, outlives it, and the new parent, which listens
on another port (worker_endpoint port 0), takes it back: it writes its address into the job's
run folder, the worker dials it there and registers again with its job's token; the same Slurm
job finishes the job, COMPLETED, each round answered once, round 1 trained once."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
import yaml

from tests.integration.federation.harness import Federation, wait_for
from tests.integration.federation.jobs import make_job, round_taker
from tests.integration.slurm.conftest import BASE, PYTHON

pytestmark = pytest.mark.slurm

ADMIN = "admin@slurm.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
SITE = "site-s"
ENV = {"SLURM_CONF": str(BASE / "etc" / "slurm.conf")}

SLOW = round_taker(4.0)


def _entry(fed, job_id):
    try:
        return json.loads((fed.workspace(SITE) / "state" / "parts" / f"{job_id}.json"
                           ).read_text())
    except (OSError, ValueError):
        return None


def _out(fed, job_id) -> str:
    logs = fed.workspace(SITE) / "jobs" / job_id / "logs"
    return "".join(p.read_text(errors="replace") for p in logs.glob("*")) if logs.is_dir() else ""


def test_a_slurm_job_outlives_its_killed_site_parent_and_finishes_the_job(slurm_cluster,
                                                                          tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", [SITE], USERS)
    site_yaml = {"launcher": "slurm",
                 "slurm": {"python_path": PYTHON, "pending_timeout": 120},
                 "worker_endpoint": {"host": "127.0.0.1", "port": 0},
                 "supervision": {"heartbeat_s": 1, "stall_s": 60, "rejoin_s": 120}}
    (fed.kit(SITE) / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    fed.start_server()
    fed.start_site(SITE, env=ENV)
    try:
        fed.wait_online(ADMIN)
        job_dir = make_job(tmp_path / "slow", script=SLOW, sites=[SITE], rounds=3)
        meta = json.loads((job_dir / "meta.json").read_text())
        meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "1Gi"}}
        (job_dir / "meta.json").write_text(json.dumps(meta))
        with fed.session(ADMIN) as s:
            job_id = s.submit(job_dir)["job_id"]
            native = wait_for(lambda: (_entry(fed, job_id) or {}).get("native_id"), 120,
                              "the job's Slurm job")
            wait_for(lambda: "took round 1" in _out(fed, job_id), 180, "round 1 on the node")
            fed.kill(SITE, signal.SIGKILL)
            fed.start_site(SITE, env=ENV)  # on another port
            final = s.wait(job_id, timeout=300)
            site_log = (fed.root / f"{SITE}.log").read_text(errors="replace")
            assert final["state"] == "FINISHED:COMPLETED", f"{final}\n{site_log[-4000:]}"
            assert f"took back the worker an earlier site parent left ({native})" in site_log
            out = _out(fed, job_id)
            assert "its site parent is now at another address" in out, out[-3000:]
            assert "rejoined its restarted site parent" in out and out.count("took round 1") == 1
            result = json.loads(next(s.download(job_id, tmp_path / "results").rglob(
                "scatter_gather.json")).read_text())
            assert [sorted(r["replies"]) for r in result["rounds"]] == [[SITE]] * 3
        # one Slurm job for the part, never a second
        names = subprocess.run(["squeue", "-h", "-o", "%i %j", "--states=all"],
                               capture_output=True, text=True, env={**ENV, "PATH": "/usr/bin:/bin"}
                               ).stdout
        assert [line for line in names.splitlines() if job_id in line and native not in line] == []
    finally:
        fed.stop_all()
