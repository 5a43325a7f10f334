"""A site parent whose worker is a container of the real engine is `kill -9`'d mid-round and
started again (issue 37 item 3): the container outlives its parent, waits for the next one
(supervision.rejoin_s), registers again with its job's token through its run folder's socket,
which the new parent opened again, and finishes the job: the same container (its id unchanged,
never a second one), the job COMPLETED, each round answered once, the round in flight not
redone. A parent that is sent SIGTERM as a Slurm-hosted one is at its allocation's end
(ATOLL_SITE_ALLOCATION) leaves its container the same way. Without re-attach (rejoin_s 0) the
restarted parent stops it, as before, and the part starts again in a new container.
"""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from tests.integration.docker.conftest import SESSION_ID, SESSION_LABEL, Engine
from tests.integration.federation.harness import Federation, wait_for
from tests.integration.federation.jobs import make_job, round_taker

pytestmark = pytest.mark.docker

ADMIN = "admin@docker.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
STUDIES = {"dockerized": {"sites": ["site-d"], "admins": [ADMIN]}}
SITE = "site-d"

# Says which round it took (the container's log is read by the test), then takes a while.
SLOW = round_taker(4.0)


def _federation(engine: Engine, root, rejoin_s: float, env=None) -> Federation:
    runtime = {SITE: "format_version: 2\nstudies:\n  dockerized: {}\n"}
    fed = Federation.provisioned(root, [SITE], USERS, STUDIES, runtime=runtime)
    site_yaml = {
        "launcher": "docker",
        "docker": {
            "base_url": engine.env["DOCKER_HOST"],
            "default_image": engine.job_image,
            "pull_policy": "never",
            "labels": {"atoll.test": "1", SESSION_LABEL: SESSION_ID},
        },
        "capacity": {"gpus": 0, "cpus": 2, "memory": "2Gi"},
        "supervision": {"heartbeat_s": 1, "stall_s": 60, "rejoin_s": rejoin_s},
    }
    (fed.kit(SITE) / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    fed.start_server()
    fed.start_site(SITE, env=env)
    fed.wait_online(ADMIN)
    return fed


def _job(tmp_path):
    job_dir = make_job(tmp_path / "slow", script=SLOW, sites=[SITE], rounds=3)
    meta = job_dir / "meta.json"
    meta.write_text(meta.read_text()[:-1] + ', "resource_spec": {"@default": {"num_of_cpus": 1, '
                    '"memory": "512Mi"}}}')
    return job_dir


def _container_of(fed: Federation, job_id: str) -> str | None:
    """The container id the site keeps for the job (state/parts), if any yet."""
    try:
        doc = json.loads((fed.workspace(SITE) / "state" / "parts" / f"{job_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return doc["native_id"]


def _logs(engine: Engine, container_id: str) -> str:
    try:
        return engine.client.containers.get(container_id).logs().decode(errors="replace")
    except Exception:  # noqa: BLE001 - gone: nothing to read
        return ""


def _rounds(session, job_id, tmp_path):
    out = session.download(job_id, tmp_path / "results")
    result = json.loads(next(out.rglob("scatter_gather.json")).read_text())
    return [sorted(r["replies"]) for r in result["rounds"]]


def _killed_mid_round(engine, fed, session, tmp_path, sig=signal.SIGKILL):
    job_id = session.submit(_job(tmp_path))["job_id"]
    first = wait_for(lambda: _container_of(fed, job_id), 120, "the job's container")
    wait_for(lambda: "took round 1" in _logs(engine, first), 120, "round 1 in the container")
    fed.kill(SITE, sig)  # mid-round: its reply to round 1 has not left
    assert engine.client.containers.get(first).status == "running"  # it outlived its parent
    fed.start_site(SITE)
    return job_id, first


def test_a_parent_whose_allocation_ends_leaves_its_container_to_its_successor(
        docker_engine: Engine, tmp_path) -> None:
    """SIGTERM to a parent started as deploy/slurm/atoll-site.sbatch starts it (its allocation
    ends): it exits and its worker runs on, for the next parent to take back."""
    fed = _federation(docker_engine, tmp_path / "fed", rejoin_s=120,
                      env={"ATOLL_SITE_ALLOCATION": "1"})
    try:
        with fed.session(ADMIN, study="dockerized") as s:
            job_id, first = _killed_mid_round(docker_engine, fed, s, tmp_path, signal.SIGTERM)
            final = s.wait(job_id, timeout=240)
            site_log = (fed.root / f"{SITE}.log").read_text(errors="replace")
            assert final["state"] == "FINISHED:COMPLETED", f"{final}\n{site_log[-4000:]}"
            assert "its workers wait 120 s for the next one" in site_log
            assert f"took back the worker an earlier site parent left ({first})" in site_log
            assert _rounds(s, job_id, tmp_path) == [[SITE]] * 3
    finally:
        fed.stop_all()


def test_a_container_outlives_its_killed_site_parent_and_finishes_the_job(
        docker_engine: Engine, tmp_path) -> None:
    fed = _federation(docker_engine, tmp_path / "fed", rejoin_s=120)
    try:
        with fed.session(ADMIN, study="dockerized") as s:
            job_id, first = _killed_mid_round(docker_engine, fed, s, tmp_path)
            final = s.wait(job_id, timeout=240)
            site_log = (fed.root / f"{SITE}.log").read_text(errors="replace")
            assert final["state"] == "FINISHED:COMPLETED", f"{final}\n{site_log[-4000:]}"
            # the same container: taken back, never a second one started
            assert f"took back the worker an earlier site parent left ({first})" in site_log
            # registered twice, the second time with the new parent: one container, no other
            assert site_log.count("its worker registered") == 2, site_log[-4000:]
            worker_log = (fed.workspace(SITE) / "jobs" / job_id / "logs" / "worker.log"
                          ).read_text(errors="replace")
            assert "rejoined its restarted site parent" in worker_log, worker_log[-3000:]
            # round 1 trained once (not redone), every round answered once
            assert worker_log.count("took round 1") == 1, worker_log[-3000:]
            assert _rounds(s, job_id, tmp_path) == [[SITE]] * 3
        server_log = (fed.root / "server.log").read_text(errors="replace")
        assert "its part starts again" not in server_log
    finally:
        fed.stop_all()
    assert _container_of(fed, job_id) is None  # its entry is gone with the job


def test_without_rejoin_the_restarted_parent_stops_the_container_and_starts_again(
        docker_engine: Engine, tmp_path) -> None:
    fed = _federation(docker_engine, tmp_path / "fed", rejoin_s=0)
    try:
        with fed.session(ADMIN, study="dockerized") as s:
            job_id, first = _killed_mid_round(docker_engine, fed, s, tmp_path)
            final = s.wait(job_id, timeout=240)
            site_log = (fed.root / f"{SITE}.log").read_text(errors="replace")
            assert f"stopped the worker an earlier site parent left ({first})" in site_log
            with pytest.raises(Exception, match="[Nn]ot [Ff]ound|No such container"):
                docker_engine.client.containers.get(first)
            # the server sent the part again (its own rejoin_s is the default): a new container
            assert final["state"] == "FINISHED:COMPLETED", f"{final}\n{site_log[-4000:]}"
            assert _rounds(s, job_id, tmp_path) == [[SITE]] * 3
        assert "its part starts again" in (fed.root / "server.log").read_text(errors="replace")
    finally:
        fed.stop_all()
