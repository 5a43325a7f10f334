from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.launchers.base import JobIdentity, LaunchError
from atoll.launchers.process import ProcessLauncher
from atoll.launchers.process_allocation import CpuAllocator, GpuAllocator
from atoll.launchers.process_sandbox import SandboxHost
from atoll.launchers.registry import LAUNCHERS, get_launcher, launcher_class
from atoll.launchers.request import build_request, job_run_folder, secret_env_values
from atoll.spec.errors import SpecError
from atoll.spec.meta import load_meta
from atoll.spec.site_config import load_site_config, parse_site_config
from atoll.spec.study_runtime import load_study_runtime
from tests.golden import assert_golden

SEED = Path(__file__).parents[2] / "fixtures/seed"
JOB_ID = "0123456789abcdef0123456789abcdef"
# A fixed host for the goldens: the real one depends on where this machine keeps its Python.
HOST = SandboxHost("/usr/bin/bwrap", (("/usr", ""), ("/bin", "usr/bin"), ("/lib", "usr/lib")),
                   ("/opt/python3.11", "/srv/venv"))


@pytest.fixture
def site(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text((SEED / "site_process.yaml").read_text())
    (local / "study_runtime.yaml").write_text((SEED / "study_runtime_process.yaml").read_text())
    return load_site_config(local), load_study_runtime(local, "process")


def request_for(site, target="hospital-a", meta=None, **kw):
    config, runtime = site
    meta = meta or load_meta(SEED / "meta.json")
    ident = JobIdentity(
        JOB_ID, meta.name, "pathology", target, "server" if target == "server" else "site"
    )
    return build_request(
        meta=meta,
        identity=ident,
        site_config=config,
        study_runtime=runtime,
        workdir=Path("/var/lib/atoll/hospital-a/jobs") / JOB_ID,
        parent_address="127.0.0.1:7001",
        **kw,
    )


# share_cpus=False throughout: a render previews the CPUs a launch would take, and these goldens
# must not depend on other atoll parents running on this machine (allocation.HostCpuLeases).
def test_seed_hospital_render_golden(site):
    launcher = ProcessLauncher(site[0], parent_pid=4242, share_cpus=False, sandbox_host=HOST)
    rendered = launcher.render(request_for(site, credentials={"ATOLL_JOB_TOKEN": "t0k3n"}))
    assert_golden("process_seed_hospital", rendered)
    assert rendered["cpu_affinity"] == [0, 1, 2, 3]
    assert rendered["memory_limit_bytes"] == 68719476736
    assert rendered["gpu_ids"] == ["0"] and rendered["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert json.loads(rendered["env"]["ATOLL_DATASETS"]) == {"slides": "/data/pathology/slides"}
    assert rendered["sandbox"] == "bwrap" and "ATOLL_PARENT_PID" not in rendered["env"]


def test_unconfined_site_render_keeps_host_paths(tmp_path):
    """`process: {sandbox: none}`: the worker runs as the parent does, with host paths."""
    local = tmp_path / "local"
    local.mkdir()
    text = (SEED / "site_process.yaml").read_text().replace("{python:", "{sandbox: none, python:")
    (local / "site.yaml").write_text(text)
    (local / "study_runtime.yaml").write_text((SEED / "study_runtime_process.yaml").read_text())
    site = load_site_config(local), load_study_runtime(local, "process")
    rendered = ProcessLauncher(site[0], parent_pid=4242, share_cpus=False).render(request_for(site))
    assert rendered["sandbox"] == "none"
    assert rendered["argv"][0] == "/usr/bin/python3"
    assert json.loads(rendered["env"]["ATOLL_DATASETS"]) == {"slides": "/srv/pathology/slides"}
    assert rendered["env"]["ATOLL_PARENT_PID"] == "4242"


def test_seed_server_render_golden(site):
    launcher = ProcessLauncher(site[0], parent_pid=4242, share_cpus=False, sandbox_host=HOST)
    rendered = launcher.render(request_for(site, "server"))
    assert_golden("process_seed_server", rendered)
    assert rendered["gpu_ids"] == [] and rendered["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert rendered["env"]["ATOLL_ROLE"] == "server"


def test_no_credential_value_in_the_rendered_object(site):
    rendered = ProcessLauncher(site[0], share_cpus=False).render(
        request_for(site, credentials={"ATOLL_JOB_TOKEN": "t0k3n"})
    )
    text = json.dumps(rendered)
    assert "t0k3n" not in text
    assert rendered["credential_env"] == ["ATOLL_JOB_TOKEN", "DB_PASSWORD", "DB_USER"]
    assert "ATOLL_JOB_TOKEN" not in rendered["env"]
    assert not any("t0k3n" in arg for arg in rendered["argv"])


def test_render_does_not_take_gpus_or_cpus(site):
    launcher = ProcessLauncher(site[0], share_cpus=False)
    req = request_for(site)
    assert launcher.render(req)["gpu_ids"] == launcher.render(req)["gpu_ids"] == ["0"]


def test_render_refuses_what_the_site_can_never_give(site):
    university = request_for(site, "university", check_capacity=False)  # 8 GPUs, the site lists 2
    with pytest.raises(LaunchError, match=r"asks for 8 GPU\(s\); this site lists 2"):
        ProcessLauncher(site[0], share_cpus=False).render(university)
    with pytest.raises(LaunchError, match=r"asks for 4 CPU\(s\); workers of this site may use 2"):
        ProcessLauncher(site[0], cpus=[0, 1], share_cpus=False).render(request_for(site))


def test_build_request_checks_capacity_and_the_deploy_map(site):
    with pytest.raises(SpecError) as info:
        request_for(site, "university")
    assert str(info.value) == (
        "resource_spec.num_of_gpus: asks 8 GPU(s); this site has 2 "
        "(capacity.gpus in local/site.yaml)"
    )
    meta = load_meta({"name": "j", "deploy_map": {"app": ["server", "site-a"]}})
    with pytest.raises(SpecError, match="this job deploys no app to 'hospital-a'"):
        request_for(site, meta=meta)


def test_build_request_resolves_everything(site):
    req = request_for(site)
    assert (req.resources.num_of_gpus, req.resources.num_of_cpus, req.resources.memory) == (
        1,
        4,
        "64Gi",
    )
    assert req.launcher_spec == {}
    assert req.study_runtime.env == {"EPOCHS": "3"}
    assert req.worker_env == {
        "ATOLL_JOB_ID": JOB_ID,
        "ATOLL_ROLE": "site",
        "ATOLL_SITE": "hospital-a",
        "ATOLL_STUDY": "pathology",
        "ATOLL_PARENT": "127.0.0.1:7001",
    }
    assert req.worker_args == ("-m", "atoll.worker")


def test_secret_env_values_come_from_the_parent_environment(site):
    entry = site[1].entry("pathology")
    values = secret_env_values(
        entry, {"PATHOLOGY_DB_USER": "u", "PATHOLOGY_DB_PASSWORD": "p", "X": "y"}
    )
    assert values == {"DB_USER": "u", "DB_PASSWORD": "p"}
    with pytest.raises(SpecError) as info:
        secret_env_values(entry, {"PATHOLOGY_DB_USER": "u"})
    assert str(info.value) == (
        "secret_env.DB_PASSWORD.key: variable PATHOLOGY_DB_PASSWORD is not "
        "set in the site parent's environment; export it before starting the site"
    )


def test_job_run_folder(site):
    assert job_run_folder(site[0], JOB_ID) == Path("/var/lib/atoll/hospital-a/jobs") / JOB_ID


def test_registry_names_every_launcher_and_loads_process_lazily():
    assert set(LAUNCHERS) == {"process", "docker", "k8s", "slurm"}
    assert launcher_class("process") is ProcessLauncher
    assert isinstance(
        get_launcher("process", parse_site_config({"launcher": "process"})), ProcessLauncher
    )
    with pytest.raises(
        ValueError, match="unknown launcher 'lsf'; choose one of process, docker, k8s, slurm"
    ):
        launcher_class("lsf")


def test_process_launcher_refuses_another_launchers_config():
    with pytest.raises(LaunchError, match="chooses launcher docker, not process"):
        ProcessLauncher(parse_site_config({"launcher": "docker"}))


def test_gpu_allocator_never_gives_one_gpu_to_two_jobs():
    gpus = GpuAllocator(["0", "1", "2"])
    assert gpus.allocate("a", 2) == ["0", "1"]
    with pytest.raises(
        LaunchError, match=r"only 1 of this site's 3 are free; in use: 0 \(job a\), 1 \(job a\)"
    ):
        gpus.allocate("b", 2)
    assert gpus.allocate("b", 1) == ["2"]
    gpus.release("a")
    assert gpus.allocate("c", 2) == ["0", "1"]
    assert gpus.allocate("d", 0) == []
    with pytest.raises(LaunchError, match="lists 3"):
        gpus.allocate("e", 4)


def test_cpu_allocator_spreads_jobs_over_the_least_used_cpus():
    cpus = CpuAllocator([0, 1, 2, 3])
    assert cpus.allocate("a", 2) == [0, 1]
    assert cpus.allocate("b", 2) == [2, 3]
    assert cpus.allocate("c", 3) == [0, 1, 2]  # all busy: share the least loaded
    cpus.release("b")
    assert cpus.preview(2) == [2, 3]
    with pytest.raises(LaunchError, match="asks for 5 CPU"):
        cpus.allocate("d", 5)


# --- several processes (torch.distributed ranks) ----------------------------------------------


def _two_gpu_site(tmp_path):
    local = tmp_path / "local2"
    local.mkdir()
    (local / "site.yaml").write_text(
        "launcher: process\nprocess: {gpu_ids: ['3', '5', '6'], sandbox: none}\n")
    return load_site_config(local), None


def test_a_job_asking_two_gpus_without_ranks_runs_one_process_that_sees_both(tmp_path):
    site2 = _two_gpu_site(tmp_path)
    meta = load_meta({"name": "one", "deploy_map": {"app": ["@ALL"]},
                      "resource_spec": {"@default": {"num_of_gpus": 2, "num_of_cpus": 4}}})
    launcher = ProcessLauncher(site2[0], parent_pid=1, cpus=[0, 1, 2, 3], share_cpus=False)
    env = launcher.render(request_for(site2, meta=meta))["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert "WORLD_SIZE" not in env and env["OMP_NUM_THREADS"] == "4"


def test_a_job_asking_two_gpus_and_two_ranks_runs_two_in_one_sandbox(tmp_path):
    site2 = _two_gpu_site(tmp_path)
    meta = load_meta({"name": "ddp", "deploy_map": {"app": ["@ALL"]},
                      "resource_spec": {"@default": {"num_of_gpus": 2, "num_of_cpus": 4}},
                      "launcher_spec": {"default": {"process": {"processes_per_node": 2}}}})
    launcher = ProcessLauncher(site2[0], parent_pid=1, cpus=[0, 1, 2, 3], share_cpus=False)
    env = launcher.render(request_for(site2, meta=meta))["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5"  # the worker deals them out, one per rank
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"]) == ("2", "2",
                                                                               "127.0.0.1")
    assert "RANK" not in env and "MASTER_PORT" not in env  # rank 0 picks a free port
    assert env["OMP_NUM_THREADS"] == "2"  # the job's 4 CPUs shared by its 2 processes
    # The server's workflow is always one process, whatever the job asks.
    server = launcher.render(request_for(site2, target="server", meta=meta))["env"]
    assert "WORLD_SIZE" not in server and server["OMP_NUM_THREADS"] == "4"


def test_processes_per_node_without_gpus_and_a_mismatch(tmp_path):
    site2 = _two_gpu_site(tmp_path)
    launcher = ProcessLauncher(site2[0], parent_pid=1, cpus=[0, 1], share_cpus=False)

    def meta(gpus, processes):
        return load_meta({"name": "ddp", "deploy_map": {"app": ["@ALL"]},
                          "resource_spec": {"@default": {"num_of_gpus": gpus, "num_of_cpus": 2}},
                          "launcher_spec": {"default": {"process": {
                              "processes_per_node": processes}}}})

    env = launcher.render(request_for(site2, meta=meta(0, 3)))["env"]
    assert env["LOCAL_WORLD_SIZE"] == "3" and env["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(LaunchError, match="processes_per_node is 3 but the job asks 2 GPU"):
        launcher.render(request_for(site2, meta=meta(2, 3)))
