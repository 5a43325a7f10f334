"""Rendered scripts and names quote every value and take checked ids only (issue 32): a newline,
``$(...)`` or a backtick in any value never becomes a command, in a job id never a name."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from atoll.launchers.base import JobIdentity, LaunchError
from atoll.launchers.docker_render import container_name
from atoll.launchers.kubernetes_render import pod_name
from atoll.launchers.process_memory_limit import create_memory_cgroup
from atoll.launchers.slurm_render import render_slurm, secrets_file_text
from tests.unit.launchers.test_slurm_render import JOB_ID, SITE, request_for

BAD_IDS = ["../../local", "a/b", "/abs", "x\ntouch {m}", "$(touch {m})", "`touch {m}`",
           "x;touch {m}", "a\0b", "", "x" * 65]


@pytest.fixture
def short_tmp():
    # The payload names the marker's path and becomes the job's name (at most 256 characters):
    # under a long TMPDIR the name alone would be refused before anything is rendered.
    folder = Path(tempfile.mkdtemp(prefix="atoll-ri-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _payload(marker: Path) -> str:
    return f"a'b\"c\n touch {marker}; $(touch {marker}) `touch {marker}` ${{IFS}}\\"


def test_every_value_in_the_slurm_script_stays_a_value(short_tmp):
    """The rendered script runs (bash, a stand-in python): none of the crafted text runs."""
    tmp_path = short_tmp
    marker = tmp_path / "ran"
    payload = _payload(marker)
    workdir = tmp_path / f"run {payload.replace(chr(0), '')}".replace("/", "_")
    request = request_for(slurm={**SITE, "python_path": "/bin/true"}, job_name=payload,
                          study={"env": {"STUDY_VAR": payload}})
    request = dataclasses.replace(request, workdir=workdir, parent_address=payload,
                                  worker_env={**request.worker_env, "ATOLL_EXTRA": payload})
    rendered = render_slurm(request)
    (workdir / "slurm").mkdir(parents=True)
    secrets = workdir / "slurm" / "secrets.env"
    secrets.write_text(secrets_file_text({"ATOLL_JOB_TOKEN": payload}))
    script = workdir / "slurm" / "worker.sbatch"
    script.write_text(rendered["script"])
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"]}, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), rendered["script"]
    assert not secrets.exists()  # the script did run through: it read and removed its secrets


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_a_crafted_job_id_is_never_rendered(tmp_path, job_id):
    job_id = job_id.format(m=tmp_path / "ran")
    request = request_for()
    request = dataclasses.replace(request, identity=dataclasses.replace(request.identity,
                                                                        job_id=job_id))
    with pytest.raises(LaunchError, match="is not a valid job id"):
        render_slurm(request)
    with pytest.raises(LaunchError, match="is not a valid job id"):
        container_name("hospital-a", job_id)
    with pytest.raises(LaunchError, match="is not a valid job id"):
        pod_name("hospital-a", job_id)


@pytest.mark.parametrize("site", ["../x", "a/b", "x\ny", "-x", ""])
def test_a_crafted_site_or_study_is_never_rendered(site):
    with pytest.raises(LaunchError, match="is not a valid site name"):
        container_name(site, JOB_ID)
    request = request_for()
    bad_study = dataclasses.replace(request.identity, study="../x\n$(id)")
    with pytest.raises(LaunchError, match="is not a valid study name"):
        render_slurm(dataclasses.replace(request, identity=bad_study))


def test_environment_names_are_posix_names():
    request = request_for()
    request = dataclasses.replace(request, worker_env={"BAD\nNAME": "x"})
    with pytest.raises(LaunchError, match="not environment variable names"):
        render_slurm(request)


@pytest.mark.parametrize("name", ["../../x", "a/b", "x\n", ".", "", "a" * 129])
def test_cgroup_names_are_one_plain_folder_name(name):
    with pytest.raises(LaunchError, match="is not a cgroup name"):
        create_memory_cgroup(name, 1 << 30)


def test_identity_fields_of_the_seed_render_as_before():
    ident = JobIdentity(JOB_ID, "pathology-fedavg", "pathology", "hospital-a", "site")
    assert container_name(ident.site, ident.job_id) == f"atoll-hospital-a-{JOB_ID}"
    assert pod_name(ident.site, ident.job_id) == "atoll-hospital-a-0123456789ab"
