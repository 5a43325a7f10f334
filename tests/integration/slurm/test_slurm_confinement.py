"""What a hostile job's worker reaches on a Slurm site (marker: slurm), on the real Slurm of
scripts/backends/slurm.sh, and why such a site is confined by configuration.

A bare worker (``slurm.sandbox: none``, Slurm's default) is a batch job of the site parent's
user: the test shows it reads the site's key (where the nodes see the kit), another study's
dataset, another job's run folder and the secrets.env of a job still pending (its job token).
That is why a bare site maps one study at most (tests/integration/federation/
test_unconfined_site.py) and why docs/launchers/slurm.md recommends Apptainer or Pyxis with the
kit on the parent's own disk and run folders under ``slurm.workspace``.

A contained worker (Apptainer) gets its run folder and its study's datasets bound, nothing else:
its render is checked here everywhere; it runs where an ``apptainer`` command exists (none can be
installed on the project's Debian machines: the skip is in tests/conftest.py's ALLOWED_SKIPS).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from atoll.launchers.base import Outcome
from atoll.launchers.slurm import SlurmLauncher
from atoll.launchers.slurm_render import render_slurm
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import ECHO, make_job
from tests.integration.slurm.conftest import BASE, PYTHON, make_request, slurm_site, study_entry

pytestmark = [pytest.mark.slurm]

ADMIN = "admin@slurm-confinement.test"
NO_APPTAINER = "no apptainer command on this host"
APPTAINER_IMAGE = os.environ.get("ATOLL_TEST_APPTAINER_IMAGE", "docker://python:3.11-slim")

# The hostile job: it tries each path it was told of and writes down what it could read.
PROBE = """
import json, os, sys
targets = json.loads(sys.argv[1]) if len(sys.argv) > 1 else json.loads(os.environ["PROBE"])
seen = {}
for name, path in targets.items():
    try:
        with open(path) as f:
            seen[name] = f.read()
    except OSError as exc:
        seen[name] = "refused: " + type(exc).__name__
with open(os.path.join(os.environ["ATOLL_WORKDIR"], "reached.json"), "w") as out:
    json.dump(seen, out)
"""


@pytest.fixture
def site_files(tmp_path: Path) -> dict[str, Path]:
    """A kit with its key, another study's data, another job's run folder, in tmp_path."""
    kit = tmp_path / "kit"
    (kit / "startup").mkdir(parents=True)
    key = kit / "startup" / "site.key"
    key.write_text("-----BEGIN PRIVATE KEY----- the site's own -----END PRIVATE KEY-----")
    key.chmod(0o600)
    data = tmp_path / "data" / "other-study"
    data.mkdir(parents=True)
    (data / "patients.csv").write_text("id,diagnosis\n1,secret\n")
    runs = tmp_path / "shared" / "jobs"
    other = runs / uuid.uuid4().hex
    other.mkdir(parents=True)
    (other / "model.bin").write_text("another job's result")
    return {"kit_key": key, "other_study_data": data / "patients.csv",
            "other_job_file": other / "model.bin", "runs": runs}


def _pending_job(runs: Path) -> tuple[SlurmLauncher, object, Path]:
    """A real job waiting in the queue (partition `held` starts none), as the site submitted it:
    its secrets.env sits in its run folder until it starts."""
    site = slurm_site(partition="held", pending_timeout=600)
    launcher = SlurmLauncher(site)
    folder = runs / uuid.uuid4().hex
    folder.mkdir()
    request = make_request(folder, "pass", site_config=site)
    handle = launcher.launch(request)
    return launcher, handle, folder / "slurm" / "secrets.env"


def test_a_bare_worker_reaches_what_its_parents_user_can_read(slurm_cluster, site_files):
    runs = site_files["runs"]
    pending_launcher, pending, secrets = _pending_job(runs)
    try:
        token = secrets.read_text()
        assert "ATOLL_JOB_TOKEN=" in token
        targets = {k: str(v) for k, v in site_files.items() if k != "runs"}
        targets["pending_secrets"] = str(secrets)
        mine = runs / uuid.uuid4().hex
        mine.mkdir()
        launcher = SlurmLauncher(slurm_site())
        try:
            request = make_request(mine, PROBE, study=study_entry(env={"PROBE": json.dumps(targets)}))
            result = launcher.wait(launcher.launch(request))
        finally:
            launcher.close()
        assert result.outcome is Outcome.COMPLETED, result.reason
        reached = json.loads((mine / "reached.json").read_text())
    finally:
        pending_launcher.cancel(pending)
        pending_launcher.close()
    # Everything: the bare batch job runs as the parent's user (here on the parent's host).
    assert reached["kit_key"] == site_files["kit_key"].read_text()
    assert reached["other_study_data"] == "id,diagnosis\n1,secret\n"
    assert reached["other_job_file"] == "another job's result"
    assert reached["pending_secrets"] == token  # that job's one-time token


def _contained_request(tmp_path: Path, site_files: dict[str, Path]):
    site = slurm_site(sandbox="apptainer", container_image=APPTAINER_IMAGE, python_path="python3")
    own = tmp_path / "own-data"
    own.mkdir()
    (own / "train.csv").write_text("x\n1\n")
    study = study_entry(datasets={"train": {"source": str(own), "mode": "ro"}})
    mine = site_files["runs"] / uuid.uuid4().hex
    mine.mkdir()
    return make_request(mine, PROBE, site_config=site, study=study), mine, own


def test_a_contained_worker_is_given_its_run_folder_and_its_datasets_only(tmp_path, site_files):
    request, mine, own = _contained_request(tmp_path, site_files)
    script = render_slurm(request)["script"]
    binds = [word.removeprefix("--bind=") for word in script.split() if word.startswith("--bind=")]
    assert binds == [f"{mine}:/atoll/job:rw", f"{own}:/data/{request.identity.study}/train:ro"]
    assert "--containall" in script and "--no-home" in script and "--cleanenv" in script
    sources = [Path(bind.split(":")[0]) for bind in binds]
    for path in (site_files["kit_key"], site_files["runs"], site_files["other_study_data"],
                 site_files["other_job_file"]):  # no bind lends them, nor a folder above them
        assert not any(path.is_relative_to(source) for source in sources), (path, sources)


def test_a_contained_worker_reaches_none_of_it(slurm_cluster, tmp_path, site_files):
    if shutil.which("apptainer") is None:
        pytest.skip(NO_APPTAINER)
    runs = site_files["runs"]
    pending_launcher, pending, secrets = _pending_job(runs)
    try:
        request, mine, _ = _contained_request(tmp_path, site_files)
        targets = {k: str(v) for k, v in site_files.items() if k != "runs"}
        targets["pending_secrets"] = str(secrets)
        request = dataclasses.replace(request, worker_args=("-c", PROBE, json.dumps(targets)))
        launcher = SlurmLauncher(request.site_config)
        try:
            result = launcher.wait(launcher.launch(request))
        finally:
            launcher.close()
        assert result.outcome is Outcome.COMPLETED, result.reason
        reached = json.loads((mine / "reached.json").read_text())
    finally:
        pending_launcher.cancel(pending)
        pending_launcher.close()
    assert all(v.startswith("refused: ") for v in reached.values()), reached


def test_a_slurm_site_runs_jobs_under_slurm_workspace(slurm_cluster, tmp_path):
    """The kit stays on the parent's disk; run folders go to the shared folder the nodes see,
    on a file system of its own (here a tmpfs, where there is one: as a shared file system is)."""
    other_fs = Path("/dev/shm")
    shared = (Path(tempfile.mkdtemp(prefix="atoll-shared-", dir=other_fs)) if other_fs.is_dir()
              else tmp_path / "shared")
    try:
        _run_one_job(tmp_path, shared)
    finally:
        if shared.is_relative_to(other_fs):
            shutil.rmtree(shared, ignore_errors=True)


def _run_one_job(tmp_path: Path, shared: Path) -> None:
    fed = Federation.provisioned(tmp_path / "fed", ["site-s"],
                                 [{"name": ADMIN, "org": "test", "role": "project_admin"}])
    site_yaml = {"launcher": "slurm",
                 "slurm": {"python_path": PYTHON, "pending_timeout": 120,
                           "workspace": str(shared)},
                 "worker_endpoint": {"host": "127.0.0.1", "port": 0}}
    (fed.kit("site-s") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    job_dir = make_job(tmp_path / "job", ECHO)
    meta = json.loads((job_dir / "meta.json").read_text())
    meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "1Gi"}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    fed.start_server()
    try:
        fed.start_site("site-s", env={"SLURM_CONF": str(BASE / "etc" / "slurm.conf")})
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as session:
            job = session.submit(job_dir, wait=True, timeout=240)
    finally:
        fed.stop_all()
    assert job["state"] == "FINISHED:COMPLETED", str(job["parts"])
    folder = shared / "jobs" / job["job_id"]
    assert list((folder / "logs").glob("slurm-*.out")), sorted(p.name for p in folder.iterdir())
    assert (folder / "slurm" / "worker.sbatch").is_file()
    assert not (fed.workspace("site-s") / "jobs" / job["job_id"]).exists()
