"""The Slurm launcher's pure half: sbatch argv and batch script from a job and a site (golden)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.launchers.base import JobIdentity, LaunchError
from atoll.launchers.request import build_request
from atoll.launchers.slurm import refusal_message
from atoll.launchers.slurm_render import (
    apptainer_image,
    pyxis_image,
    render_slurm,
    secrets_file_text,
    slurm_memory,
)
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.golden import assert_golden

SEED = Path(__file__).parents[2] / "fixtures" / "seed"
JOB_ID = "0123456789abcdef0123456789abcdef"
WORKDIR = Path("/shared/atoll/university/jobs") / JOB_ID
TOKEN = "tok-SECRET-VALUE"
SEED_RESOURCES = json.loads((SEED / "meta.json").read_text())["resource_spec"]
PATHOLOGY = yaml.safe_load((SEED / "study_runtime_host.yaml").read_text())["studies"]["pathology"]
SITE = {"partition": "gpu", "account": "fl", "qos": "normal", "time": "4:00:00"}


def request_for(
    site: str = "hospital-a",
    *,
    slurm: dict[str, Any] | None = None,
    study: dict[str, Any] | None = None,
    resource_spec: dict[str, Any] | None = None,
    launcher_spec: dict[str, Any] | None = None,
    job_name: str = "pathology-fedavg",
) -> Any:
    """A LaunchRequest built the way the site parent builds it, from parsed documents."""
    site_config = parse_site_config(
        {"launcher": "slurm", "slurm": SITE if slurm is None else slurm}
    )
    if study is None:  # a bare worker uses no image: FLARE 2.9 and atoll refuse one there
        bare = (SITE if slurm is None else slurm).get("sandbox", "none") == "none"
        study = {k: v for k, v in PATHOLOGY.items() if not (bare and k == "container")}
    runtime = parse_study_runtime(
        {"format_version": 2, "studies": {"pathology": study}}, "slurm"
    )
    meta = load_meta(
        {
            "name": job_name,
            "deploy_map": {"app": ["@ALL"]},
            "resource_spec": SEED_RESOURCES if resource_spec is None else resource_spec,
            "launcher_spec": launcher_spec or {},
        }
    )
    role = "server" if site == "server" else "site"
    return build_request(
        meta=meta,
        identity=JobIdentity(JOB_ID, job_name, "pathology", site, role),
        site_config=site_config,
        study_runtime=runtime,
        workdir=WORKDIR,
        parent_address="login1.cluster.example.org:7001",
        credentials={"ATOLL_JOB_TOKEN": TOKEN},
        check_capacity=False,
    )


def golden(rendered: dict[str, Any]) -> dict[str, Any]:
    """The script as a list of lines: a readable diff when it changes."""
    return {**rendered, "script": rendered["script"].splitlines()}


def argv_value(rendered: dict[str, Any], flag: str) -> str | None:
    return next(
        (a.partition("=")[2] for a in rendered["sbatch_argv"] if a.startswith(f"--{flag}=")), None
    )


def bash_syntax_ok(script: str) -> None:
    result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --- the seed's example, and the golden files ---------------------------------------------------


def test_seed_hospital_bare_golden() -> None:
    rendered = render_slurm(request_for("hospital-a", slurm={**SITE, "python_path": "/opt/py"}))
    assert_golden("slurm/seed_hospital_a_bare", golden(rendered))
    assert argv_value(rendered, "cpus-per-task") == "4"
    assert argv_value(rendered, "mem") == "65536M"
    assert argv_value(rendered, "gres") == "gpu:1"
    assert rendered["sbatch_argv"][:2] == ["sbatch", "--parsable"]
    assert rendered["script"].rstrip().endswith("exec /opt/py -m atoll.worker")
    bash_syntax_ok(rendered["script"])


def test_seed_university_and_server() -> None:
    university = render_slurm(request_for("university"))
    server = render_slurm(request_for("server"))
    assert argv_value(university, "gres") == "gpu:8"
    assert argv_value(server, "gres") is None  # an explicit 0 GPUs: no --gres at all
    assert argv_value(server, "cpus-per-task") == "4" and argv_value(server, "mem") == "65536M"
    assert "ATOLL_ROLE=server" in server["script"]


def test_apptainer_golden() -> None:
    study = {
        **PATHOLOGY,
        "datasets": {
            **PATHOLOGY["datasets"],
            "scratch": {"source": "/scratch/pathology", "mode": "rw"},
        },
        "env": {"OMP_NUM_THREADS": "4"},
        "secret_mounts": {"db-ca": {"source": "/etc/pathology/ca", "mount_path": "/run/ca"}},
    }
    rendered = render_slurm(request_for(slurm={**SITE, "sandbox": "apptainer"}, study=study))
    assert_golden("slurm/apptainer", golden(rendered))
    script = rendered["script"]
    for flag in ("--containall", "--cleanenv", "--no-home", "--nv", "--pwd=/atoll/job"):
        assert flag in script
    assert "--bind=/srv/pathology/slides:/data/pathology/slides:ro" in script
    assert "--bind=/scratch/pathology:/data/pathology/scratch:rw" in script
    assert "--bind=/etc/pathology/ca:/run/ca:ro" in script
    assert "docker://registry.example.com/pathology-trainer:1.0" in script
    # --cleanenv: every variable the worker needs goes in as APPTAINERENV_*, secrets by name only.
    assert 'export APPTAINERENV_DB_PASSWORD="${DB_PASSWORD}"' in script
    assert "export APPTAINERENV_ATOLL_WORKDIR=/atoll/job" in script
    assert "export APPTAINERENV_OMP_NUM_THREADS=4" in script
    bash_syntax_ok(script)


def test_apptainer_without_gpus_has_no_nv() -> None:
    rendered = render_slurm(request_for("server", slurm={**SITE, "sandbox": "apptainer"}))
    assert "--nv" not in rendered["script"]


def test_pyxis_golden() -> None:
    study = {**PATHOLOGY, "slurm": {"sandbox": "pyxis"}}
    rendered = render_slurm(request_for(study=study))
    assert_golden("slurm/pyxis", golden(rendered))
    script = rendered["script"]
    assert "--container-image=registry.example.com#pathology-trainer:1.0" in script
    mounts = "/shared/atoll/university/jobs/" + JOB_ID + ":/atoll/job:rw,"
    assert f"--container-mounts={mounts}/srv/pathology/slides:/data/pathology/slides:ro" in script
    assert "exec srun --nodes=1 --ntasks=1" in script
    assert 'ATOLL_RANK="$SLURM_PROCID"' in script
    bash_syntax_ok(script)


def test_multi_node_golden() -> None:
    """The seed's university asks 4 CPUs and 64Gi: per node on 2 nodes (NVIDIA FLARE 2.9)."""
    launcher_spec = {"university": {"slurm": {"nodes": 2, "gpus_per_node": 4, "time": "30:00",
                                              "processes_per_node": 4}}}
    rendered = render_slurm(request_for("university", launcher_spec=launcher_spec))
    assert_golden("slurm/multi_node", golden(rendered))
    # One task (rank) per GPU: 4 on each of 2 nodes, the node's CPUs shared (at least one each).
    for flag, value in (
        ("nodes", "2"),
        ("ntasks", "8"),
        ("ntasks-per-node", "4"),
        ("gres", "gpu:4"),
        ("cpus-per-task", "1"),
        ("mem", "65536M"),
        ("time", "30:00"),
    ):
        assert argv_value(rendered, flag) == value, flag
    script = rendered["script"]
    assert "exec srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=1" in script
    assert_rendezvous(script, prefix="", tasks_per_node=4)
    assert "ATOLL_RANK=0" not in script
    bash_syntax_ok(script)


def assert_rendezvous(script: str, prefix: str, tasks_per_node: int) -> None:
    """PyTorch's rendezvous variables, and the credentials withheld from every rank but 0."""
    p = prefix
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script
    assert f'export {p}MASTER_ADDR="${{master_addr:-$master_node}}" ' in script
    assert f'{p}MASTER_PORT="$((20000 + SLURM_JOB_ID % 20000))"' in script
    assert (f'export {p}RANK="$SLURM_PROCID" {p}WORLD_SIZE="$SLURM_NTASKS" '
            f'{p}LOCAL_RANK="$SLURM_LOCALID" {p}LOCAL_WORLD_SIZE={tasks_per_node} ') in script
    withheld = script.split('[ "$SLURM_PROCID" = 0 ] || unset ', 1)[1].split(";", 1)[0].split()
    assert {"ATOLL_JOB_TOKEN", "DB_PASSWORD", f"{p}ATOLL_JOB_TOKEN", f"{p}DB_PASSWORD"} <= set(
        withheld)


MULTI_NODE = {"university": {"slurm": {"nodes": 2, "gpus_per_node": 4, "time": "30:00",
                                       "processes_per_node": 4}}}


def test_gpus_without_ranks_are_one_task_per_node_that_sees_them_all() -> None:
    """As FLARE renders it: a job asking GPUs but no ranks runs one task per node, with the
    node's CPUs and GPUs; a script not written for several ranks never runs four times."""
    launcher_spec = {"university": {"slurm": {"nodes": 2, "gpus_per_node": 4}}}
    rendered = render_slurm(request_for("university", launcher_spec=launcher_spec))
    for flag, value in (("nodes", "2"), ("ntasks", "2"), ("ntasks-per-node", "1"),
                        ("gres", "gpu:4"), ("cpus-per-task", "4")):
        assert argv_value(rendered, flag) == value, flag


def test_apptainer_multi_node_golden() -> None:
    study = {**PATHOLOGY, "slurm": {"sandbox": "apptainer"}}
    rendered = render_slurm(request_for("university", study=study, launcher_spec=MULTI_NODE))
    assert_golden("slurm/apptainer_multi_node", golden(rendered))
    script = rendered["script"]
    assert_rendezvous(script, prefix="APPTAINERENV_", tasks_per_node=4)
    # srun starts one task per GPU; each runs apptainer on its node.
    assert "exec srun --nodes=2 --ntasks=8 --ntasks-per-node=4" in script
    assert script.index("atoll-worker") < script.index("apptainer exec")
    bash_syntax_ok(script)


def test_pyxis_multi_node_golden() -> None:
    study = {**PATHOLOGY, "slurm": {"sandbox": "pyxis"}}
    rendered = render_slurm(request_for("university", study=study, launcher_spec=MULTI_NODE))
    assert_golden("slurm/pyxis_multi_node", golden(rendered))
    script = rendered["script"]
    assert_rendezvous(script, prefix="", tasks_per_node=4)
    assert "--container-image=registry.example.com#pathology-trainer:1.0" in script
    bash_syntax_ok(script)


def test_processes_per_node_one_keeps_one_task_per_node() -> None:
    spec = {"university": {"slurm": {"nodes": 2, "gpus_per_node": 4, "processes_per_node": 1}}}
    rendered = render_slurm(request_for("university", launcher_spec=spec))
    assert argv_value(rendered, "ntasks") == "2" and argv_value(rendered, "cpus-per-task") == "4"
    assert_rendezvous(rendered["script"], prefix="", tasks_per_node=1)


def test_processes_per_node_must_match_the_gpus() -> None:
    spec = {"university": {"slurm": {"nodes": 2, "gpus_per_node": 4, "processes_per_node": 3}}}
    with pytest.raises(LaunchError, match="processes_per_node is 3 .* 4 GPU"):
        render_slurm(request_for("university", launcher_spec=spec))


def test_one_task_renders_no_rendezvous_and_withholds_nothing() -> None:
    script = render_slurm(request_for("hospital-a"))["script"]
    assert "MASTER_ADDR" not in script and "unset" not in script
    assert "export ATOLL_RANK=0 ATOLL_WORLD_SIZE=1" in script


def test_the_server_never_runs_several_processes() -> None:
    spec = {"server": {"slurm": {"processes_per_node": 4}}}
    rendered = render_slurm(request_for("server", launcher_spec=spec))
    assert argv_value(rendered, "ntasks") == "1"


def test_native_per_node_values_win_over_spreading() -> None:
    spec = {"default": {"slurm": {"nodes": 3, "cpus_per_node": 8, "mem_per_node": "10Gi"}}}
    rendered = render_slurm(
        request_for(resource_spec={"@default": {"num_of_gpus": 0}}, launcher_spec=spec)
    )
    assert argv_value(rendered, "cpus-per-task") == "8"
    assert argv_value(rendered, "mem") == "10240M"
    assert argv_value(rendered, "nodes") == "3"


# --- rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "slurm"), [("64Gi", "65536M"), ("512Mi", "512M"), ("1Ti", "1048576M")]
)
def test_memory_in_mib(memory: str, slurm: str) -> None:
    assert slurm_memory(memory) == slurm


def test_no_memory_asked_means_no_mem_flag() -> None:
    rendered = render_slurm(request_for(resource_spec={"@default": {"num_of_cpus": 2}}))
    assert argv_value(rendered, "mem") is None and argv_value(rendered, "gres") is None


def test_study_overrides_site_directives_and_names_the_source() -> None:
    bare = {k: v for k, v in PATHOLOGY.items() if k != "container"}
    study = {**bare, "slurm": {"partition": "pathology", "account": "path-lab"}}
    site = {**SITE, "constraint": "a100", "reservation": "fl-week"}
    rendered = render_slurm(request_for(slurm=site, study=study))
    assert argv_value(rendered, "partition") == "pathology"
    assert argv_value(rendered, "account") == "path-lab"
    assert argv_value(rendered, "qos") == "normal"  # not overridden: the site's
    assert argv_value(rendered, "constraint") == "a100"
    assert argv_value(rendered, "reservation") == "fl-week"
    sources = rendered["directive_sources"]
    assert sources["partition"] == "local/study_runtime.yaml studies.pathology.slurm.partition"
    assert sources["qos"] == "local/site.yaml slurm.qos"


def test_job_time_overrides_site_time() -> None:
    rendered = render_slurm(request_for(launcher_spec={"default": {"slurm": {"time": "15"}}}))
    assert argv_value(rendered, "time") == "15"
    assert rendered["directive_sources"]["time"] == "the job's meta.json launcher_spec slurm.time"
    bare = render_slurm(request_for(slurm={}))
    assert argv_value(bare, "time") is None and argv_value(bare, "partition") is None


def test_name_comment_and_output_identify_the_job() -> None:
    rendered = render_slurm(request_for(job_name="Path; rm -rf / $(x)"))
    assert argv_value(rendered, "job-name") == f"atoll-hospital-a-{JOB_ID}"
    comment = argv_value(rendered, "comment")
    assert comment == (
        f"atoll job_id={JOB_ID} site=hospital-a study=pathology role=site name=Path_rm_-rf_x_"
    )
    assert argv_value(rendered, "output") == f"{WORKDIR}/logs/slurm-%j.out"
    assert argv_value(rendered, "chdir") == str(WORKDIR)
    assert {"--export=NONE", "--no-requeue"} <= set(rendered["sbatch_argv"])


def test_no_secret_value_in_argv_or_script_only_names() -> None:
    for sandbox in ("none", "apptainer", "pyxis"):
        rendered = render_slurm(request_for(slurm={**SITE, "sandbox": sandbox}))
        assert TOKEN not in json.dumps(rendered)
        assert rendered["secrets_file"] == {
            "path": f"{WORKDIR}/slurm/secrets.env",
            "mode": "0600",
            "variables": ["ATOLL_JOB_TOKEN", "DB_PASSWORD", "DB_USER"],
        }
        script = rendered["script"]
        assert 'set -a; . "$secrets"; set +a' in script and 'rm -f -- "$secrets"' in script
        # sourced and deleted before anything else runs
        assert script.index('rm -f -- "$secrets"') < script.index("exec ")


def test_secrets_file_text_quotes_values_for_the_shell() -> None:
    text = secrets_file_text({"ATOLL_JOB_TOKEN": 'a\'b $(c) "d"', "DB_USER": "u"})
    result = subprocess.run(
        ["bash", "-c", f'set -a; {text}\nprintf %s "$ATOLL_JOB_TOKEN"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == 'a\'b $(c) "d"'
    with pytest.raises(LaunchError, match="not environment variable names: bad-name"):
        secrets_file_text({"bad-name": "x"})


def test_bare_worker_gets_host_dataset_paths_and_refuses_secret_mounts() -> None:
    rendered = render_slurm(request_for())
    env_line = "export ATOLL_DATASETS=" + shlex.quote('{"slides": "/srv/pathology/slides"}')
    assert env_line in rendered["script"]
    assert "ATOLL_DATA_ROOT" not in rendered["script"]
    study = {**PATHOLOGY, "secret_mounts": {"ca": {"source": "/etc/ca", "mount_path": "/run/ca"}}}
    with pytest.raises(LaunchError, match=r"studies\.pathology\.secret_mounts.*apptainer or pyxis"):
        render_slurm(request_for(study=study))


def test_container_sandbox_without_image_says_where_to_set_it() -> None:
    study = {k: v for k, v in PATHOLOGY.items() if k != "container"}
    with pytest.raises(LaunchError, match=r"container\.image.*slurm\.container_image"):
        render_slurm(request_for(slurm={**SITE, "sandbox": "pyxis"}, study=study))
    site = {**SITE, "sandbox": "apptainer", "container_image": "/images/trainer.sif"}
    rendered = render_slurm(request_for(slurm=site, study=study))
    assert "    /images/trainer.sif \\\n    python3 -m atoll.worker" in rendered["script"]


def test_gpus_not_splitting_over_nodes_is_refused() -> None:
    request = request_for(
        resource_spec={"@default": {"num_of_gpus": 0}},
        launcher_spec={"default": {"slurm": {"nodes": 2}}},
    )
    object.__setattr__(request, "resources", type(request.resources)(num_of_gpus=3))
    with pytest.raises(LaunchError, match="gpus_per_node"):
        render_slurm(request)


@pytest.mark.parametrize(
    ("image", "apptainer", "pyxis"),
    [
        (
            "registry.example.com/team/img:1",
            "docker://registry.example.com/team/img:1",
            "registry.example.com#team/img:1",
        ),
        ("ubuntu:22.04", "docker://ubuntu:22.04", "ubuntu:22.04"),
        ("localhost:5000/img", "docker://localhost:5000/img", "localhost:5000#img"),
        ("/images/img.sif", "/images/img.sif", "/images/img.sif"),
        ("oras://ghcr.io/x/y:1", "oras://ghcr.io/x/y:1", "oras://ghcr.io/x/y:1"),
        (
            "nvcr.io#nvidia/pytorch:24.01",
            "docker://nvcr.io#nvidia/pytorch:24.01",
            "nvcr.io#nvidia/pytorch:24.01",
        ),
    ],
)
def test_image_references(image: str, apptainer: str, pyxis: str) -> None:
    assert apptainer_image(image) == apptainer
    assert pyxis_image(image) == pyxis


def test_other_launcher_site_is_refused() -> None:
    request = request_for()
    site = parse_site_config({"launcher": "process"})
    object.__setattr__(request, "site_config", site)
    with pytest.raises(LaunchError, match="chooses launcher process, not slurm"):
        render_slurm(request)


# --- sbatch refusals name the directive and where it was configured ----------------------------


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (
            "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission "
            "failed: Invalid partition name specified",
            "partition 'gpu' (from local/site.yaml slurm.partition)",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition "
            "combination specified",
            "account 'fl' (from local/site.yaml slurm.account)",
        ),
        (
            "sbatch: error: Batch job submission failed: Invalid qos specification",
            "qos 'normal' (from local/site.yaml slurm.qos)",
        ),
        (
            "sbatch: error: Memory specification can not be satisfied",
            "resources --nodes=1 --cpus-per-task=4 --mem=65536M --gres=gpu:1 --time=4:00:00",
        ),
    ],
)
def test_refusal_message(stderr: str, expected: str) -> None:
    request = request_for()
    result = subprocess.CompletedProcess(["sbatch"], 1, "", stderr)
    message = refusal_message(request, render_slurm(request), result)
    assert expected in message
    assert f"Slurm refused the worker of job {JOB_ID} for hospital-a" in message
    assert stderr.splitlines()[-1].split("error: ")[-1] in message
