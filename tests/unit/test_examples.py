"""The shipped examples stay valid: the seed's pathology study on three kinds of site."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.main import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pathology"


def _render(site: str) -> dict:
    result = CliRunner().invoke(cli, ["site", "render", str(EXAMPLE / "sites" / site),
                                      str(EXAMPLE / "job"), "--study", "pathology",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("site", ["hospital-a", "hospital-b", "university"])
def test_example_sites_validate(site, tmp_path):
    # a copy: validate records what passes in the kit's workspace, never in the source tree
    shutil.copytree(EXAMPLE / "sites" / site, tmp_path / site)
    result = CliRunner().invoke(cli, ["site", "validate", str(tmp_path / site)])
    assert result.exit_code == 0, result.output


def test_example_renders_the_seed_resources_on_each_backend():
    text = json.dumps(_render("hospital-a"))
    assert '"nano_cpus": 4000000000' in text and '"mem_limit": 68719476736' in text
    assert '"/data/pathology/slides"' in text
    pod = json.dumps(_render("hospital-b"))
    assert '"nvidia.com/gpu": "1"' in pod or '"nvidia.com/gpu": 1' in pod
    assert "pathology-data-pvc" in pod and "secretKeyRef" in pod
    slurm = json.dumps(_render("university"))
    # 8 GPUs and no ranks asked: one task that sees all 8 GPUs and gets the job's 4 CPUs, as
    # FLARE renders it (a script not written for ranks never runs 8 times: launchers/ranks.py)
    for flag in ("--ntasks-per-node=1", "--cpus-per-task=4", "--mem=65536M", "--gres=gpu:8",
                 "--account=pathology"):
        assert flag in slurm
    assert "login01.hpc.university.example:7101" in slurm  # workers dial the advertised name
