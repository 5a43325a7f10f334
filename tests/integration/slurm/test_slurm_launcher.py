"""The Slurm launcher on the real Slurm of scripts/backends/slurm.sh (bare sandbox).

Each test drives SlurmLauncher directly with a tiny worker program (``worker_args``). Slurm
checks time limits every 30 s and its smallest ``--time`` is one minute, so the TIMEOUT job is
submitted when this module starts and checked by its last test: the other tests run meanwhile.
What every launcher does (exit codes, cancel, unknown handles, resources in the render) is
tests/integration/launchers/test_contract.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from atoll.launchers.base import LaunchError, Outcome
from atoll.launchers.slurm import SlurmLauncher, run_command
from atoll.spec.resources import Resources
from tests.integration.slurm.conftest import (
    BASE,
    make_request,
    scontrol_job,
    slurm_site,
    study_entry,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

WRITE_ENV = """
import json, os
keys = ("SLURMD_NODENAME", "ATOLL_RANK", "ATOLL_WORLD_SIZE", "ATOLL_JOB_ID", "ATOLL_WORKDIR",
        "CUDA_VISIBLE_DEVICES", "ATOLL_PARENT")
info = {k: os.environ.get(k) for k in keys}
path = os.path.join(os.environ["ATOLL_WORKDIR"], "rank-%s.json" % os.environ["ATOLL_RANK"])
open(path, "w").write(json.dumps(info))
"""


@pytest.fixture(scope="module")
def timeout_job(slurm_cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A worker that outlives its one-minute limit, started before the other tests."""
    launcher = SlurmLauncher(slurm_site())
    request = make_request(
        tmp_path_factory.mktemp("timeout"),
        "import time; time.sleep(600)",
        launcher_spec={"time": "1"},
    )
    handle = launcher.launch(request)
    yield launcher, handle
    launcher.cancel(handle)
    launcher.close()


def test_launch_runs_to_completed(launcher, tmp_path: Path, timeout_job) -> None:
    notes: list[str] = []
    handle = launcher.launch(make_request(tmp_path, WRITE_ENV), on_progress=notes.append)
    assert handle.backend == "slurm" and handle.native_id.isdigit()
    result = launcher.wait(handle)
    assert result.outcome is Outcome.COMPLETED, result.reason
    assert result.exit_code == 0
    info = json.loads((tmp_path / "rank-0.json").read_text())
    assert info["SLURMD_NODENAME"] in {"n1", "n2"}
    assert (info["ATOLL_RANK"], info["ATOLL_WORLD_SIZE"]) == ("0", "1")
    assert info["ATOLL_WORKDIR"] == str(tmp_path) and info["ATOLL_PARENT"] == "127.0.0.1:9"
    assert info["CUDA_VISIBLE_DEVICES"] is None  # no GPU asked
    assert (tmp_path / "logs" / f"slurm-{handle.native_id}.out").exists()
    assert all(n.startswith(("pending: ", "running on ", "completing")) for n in notes), notes


def test_slurm_gets_the_rendered_resources_and_directives(tmp_path: Path) -> None:
    site = slurm_site(partition="gpu", account="fl", qos="high")
    launcher = SlurmLauncher(site)
    try:
        request = make_request(
            tmp_path,
            WRITE_ENV + "import time; time.sleep(1)\n",
            site_config=site,
            resources=Resources(num_of_gpus=1, num_of_cpus=2, memory="256Mi"),
        )
        rendered = launcher.render(request)["sbatch_argv"]
        assert {"--cpus-per-task=2", "--mem=256M", "--gres=gpu:1"} <= set(rendered)
        handle = launcher.launch(request)
        job = scontrol_job(handle.native_id)
        assert job["CPUs/Task"] == "2" and job["NumCPUs"] == "2"
        assert job["MinMemoryNode"] == "256M"
        assert job["TresPerNode"] == "gres:gpu:1"
        assert (job["Partition"], job["Account"], job["QOS"]) == ("gpu", "fl", "high")
        assert job["JobName"] == f"atoll-slurm-site-{request.identity.job_id}"
        comment = subprocess.run(
            ["squeue", "-h", "-j", handle.native_id, "-o", "%k"], capture_output=True, text=True
        ).stdout
        assert f"atoll job_id={request.identity.job_id} site=slurm-site" in comment
        result = launcher.wait(handle)
        assert result.outcome is Outcome.COMPLETED, result.reason
        gpus = json.loads((tmp_path / "rank-0.json").read_text())["CUDA_VISIBLE_DEVICES"]
        assert gpus is not None and len(gpus.split(",")) == 1  # one fake GPU of the node
    finally:
        launcher.close()


def test_memory_hog_is_out_of_memory(launcher, tmp_path: Path) -> None:
    hog = "x = bytearray(400 * 1024 * 1024); import time; time.sleep(2)"
    request = make_request(tmp_path, hog, resources=Resources(num_of_cpus=1, memory="64Mi"))
    result = launcher.wait(launcher.launch(request))
    assert result.outcome is Outcome.FAILED
    assert "OUT_OF_MEMORY" in result.reason and "--mem=64M" in result.reason, result.reason


@pytest.mark.parametrize(
    ("setting", "value"),
    [("partition", "no-such-partition"), ("account", "no-such-account"), ("qos", "no-such-qos")],
)
def test_unknown_directive_is_refused_naming_it(tmp_path: Path, setting: str, value: str) -> None:
    site = slurm_site(**{setting: value})
    launcher = SlurmLauncher(site)
    try:
        request = make_request(tmp_path, "pass", site_config=site)
        started = time.monotonic()
        with pytest.raises(LaunchError) as err:
            launcher.launch(request)
        assert time.monotonic() - started < 10  # refused at submit, no hang
    finally:
        launcher.close()
    message = str(err.value)
    assert f"{setting} {value!r} (from local/site.yaml slurm.{setting})" in message
    assert "sbatch said:" in message and "Invalid" in message
    assert not (tmp_path / "slurm" / "secrets.env").exists()


def test_impossible_resources_are_refused(launcher, tmp_path: Path) -> None:
    request = make_request(tmp_path, "pass", resources=Resources(num_of_gpus=3, num_of_cpus=1))
    with pytest.raises(LaunchError, match=r"resources .*--gres=gpu:3.*sbatch said:"):
        launcher.launch(request)


def test_two_nodes_run_one_task_each(launcher, tmp_path: Path) -> None:
    request = make_request(
        tmp_path,
        WRITE_ENV,
        # per node (FLARE 2.9's meaning): one CPU of each node's two, so a job still ending
        # on one node (a test before) does not hold this one past its pending_timeout
        resources=Resources(num_of_gpus=2, num_of_cpus=1, memory="256Mi"),
        launcher_spec={"nodes": 2, "gpus_per_node": 1},
    )
    result = launcher.wait(launcher.launch(request))
    assert result.outcome is Outcome.COMPLETED, result.reason
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert {r["SLURMD_NODENAME"] for r in ranks} == {"n1", "n2"}
    assert {r["ATOLL_WORLD_SIZE"] for r in ranks} == {"2"}
    assert all(r["CUDA_VISIBLE_DEVICES"] for r in ranks)


def test_pending_past_its_timeout_is_cancelled(tmp_path: Path) -> None:
    site = slurm_site(partition="held", pending_timeout=60)  # `held` never starts a job
    launcher = SlurmLauncher(site)
    try:
        notes: list[str] = []
        request = make_request(
            tmp_path, "pass", site_config=site, launcher_spec={"pending_timeout": 1}
        )
        result = launcher.wait(launcher.launch(request, on_progress=notes.append))
    finally:
        launcher.close()
    assert result.outcome is Outcome.FAILED
    assert "pending_timeout of 1 s (Slurm's reason: PartitionDown); cancelled" in result.reason
    assert "pending: PartitionDown" in notes


def test_secrets_travel_in_a_0600_file_that_is_removed(tmp_path: Path) -> None:
    token, password = "tok-" + os.urandom(8).hex(), "pw-" + os.urandom(8).hex()
    modes: list[int] = []
    argvs: list[list[str]] = []

    def recording_runner(argv: Sequence[str], timeout: float):
        if argv[0] == "sbatch":  # the secrets file exists right before the submit
            argvs.append(list(argv))
            modes.append((tmp_path / "slurm" / "secrets.env").stat().st_mode & 0o777)
        return run_command(argv, timeout)

    launcher = SlurmLauncher(slurm_site(), recording_runner)
    study = study_entry(
        secret_env={"DB_PASSWORD": {"source": "env", "key": "PATHOLOGY_DB_PASSWORD"}}
    )
    check = (
        "import hashlib, os, pathlib\n"
        "w = pathlib.Path(os.environ['ATOLL_WORKDIR'])\n"
        "h = lambda v: hashlib.sha256(v.encode()).hexdigest()\n"
        "(w / 'seen').write_text(h(os.environ['ATOLL_JOB_TOKEN']) + ' ' + "
        "h(os.environ['DB_PASSWORD']) + ' ' + str((w / 'slurm' / 'secrets.env').exists()))\n"
    )
    try:
        # The site parent read DB_PASSWORD's value from its environment (PATHOLOGY_DB_PASSWORD):
        # it reaches the launcher only in the request's credentials.
        credentials = {"ATOLL_JOB_TOKEN": token, "DB_PASSWORD": password}
        request = make_request(tmp_path, check, study=study, credentials=credentials)
        handle = launcher.launch(request)
        result = launcher.wait(handle)
    finally:
        launcher.close()
    assert result.outcome is Outcome.COMPLETED, result.reason
    assert modes == [0o600]
    sha = lambda v: hashlib.sha256(v.encode()).hexdigest()  # noqa: E731
    assert (tmp_path / "seen").read_text() == f"{sha(token)} {sha(password)} False"
    assert not (tmp_path / "slurm" / "secrets.env").exists()
    script = (tmp_path / "slurm" / "worker.sbatch").read_text()
    for secret in (token, password):
        assert secret not in script and secret not in " ".join(argvs[0])
    # Nor in what Slurm keeps: the controller's saved job (script, environment) and node spools.
    found = subprocess.run(
        ["grep", "-rl", "-e", token, "-e", password, str(BASE / "spool")],
        capture_output=True,
        text=True,
    )
    assert found.stdout == "", f"a secret is in Slurm's state: {found.stdout}"


def test_over_time_limit_is_timeout(timeout_job) -> None:
    launcher, handle = timeout_job
    result = launcher.wait(handle)  # a minute after submission, plus Slurm's 30 s check
    assert result.outcome is Outcome.FAILED
    assert "TIMEOUT" in result.reason and "--time=1" in result.reason, result.reason


def test_flare_study_setup_and_mem_per_node_reach_the_real_job(tmp_path: Path) -> None:
    """NVIDIA FLARE 2.9's study slurm.setup runs in the batch script before the worker; its
    launcher_spec mem_per_node (an integer of MiB) is the node's memory; a job that asks no
    CPUs gets no --cpus-per-task (Slurm's default, one CPU per task)."""
    site = slurm_site()
    launcher = SlurmLauncher(site)
    study = study_entry(slurm={"setup": "export FROM_SETUP=yes"}, env={"EPOCHS": 3})
    program = ("import os; open(os.path.join(os.environ['ATOLL_WORKDIR'], 'setup.txt'), 'w')"
               ".write(os.environ.get('FROM_SETUP', 'missing') + ' ' + os.environ['EPOCHS'])")
    try:
        request = make_request(tmp_path, program, site_config=site, study=study,
                               resources=Resources(), launcher_spec={"mem_per_node": 192})
        rendered = launcher.render(request)["sbatch_argv"]
        assert "--mem=192M" in rendered
        assert not [a for a in rendered if a.startswith("--cpus-per-task")]
        handle = launcher.launch(request)
        job = scontrol_job(handle.native_id)
        assert job["MinMemoryNode"] == "192M" and job["NumCPUs"] == "1"
        result = launcher.wait(handle)
        assert result.outcome is Outcome.COMPLETED, result.reason
        assert (tmp_path / "setup.txt").read_text() == "yes 3"
    finally:
        launcher.close()
