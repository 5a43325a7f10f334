"""The digest of what a launcher rendered (launchers/base.py `render_digest`), which each launch
keeps and the site's launch entry names: it follows the render (a request asking more memory
renders, and digests, differently), never a credential (the same render whatever the job token
and secret values), and the launch entry carries it with no secret value."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from atoll.launchers.base import RENDER_DIGEST, render_digest
from atoll.launchers.docker_render import render_docker
from atoll.launchers.kubernetes_render import render as render_k8s
from atoll.launchers.process import ProcessLauncher
from atoll.launchers.slurm_render import render_slurm
from atoll.site.provenance import launch_body
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.unit.launchers.test_launch_credentials import STUDY, VALUE, request

RENDERS = {
    "process": lambda r: ProcessLauncher(parse_site_config({"launcher": "process"}),
                                         parent_pid=4242, share_cpus=False).render(r),
    "docker": render_docker,
    "k8s": render_k8s,
    "slurm": render_slurm,
}
SETTINGS = {"docker": {"default_image": "site/default:1"},
            "k8s": {"default_image": "site/default:1", "host_network": True}}
SECRETS = {"ATOLL_JOB_TOKEN": "tok-" + "t" * 20, "DB_PASSWORD": VALUE}


@pytest.mark.parametrize("launcher", sorted(RENDERS))
def test_the_digest_follows_the_render_and_never_a_credential(tmp_path: Path, launcher: str):
    render = RENDERS[launcher]
    asked = request(tmp_path, launcher, SECRETS, SETTINGS.get(launcher))
    digest = render_digest(render(asked))
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert render_digest(render(asked)) == digest  # the same render, the same digest
    other_secrets = {name: value + "-other" for name, value in SECRETS.items()}
    again = request(tmp_path, launcher, other_secrets, SETTINGS.get(launcher))
    assert render_digest(render(again)) == digest
    more = dataclasses.replace(asked, resources=dataclasses.replace(asked.resources,
                                                                    memory="2Gi"))
    assert render_digest(render(more)) != digest  # what the launcher renders changed
    text = json.dumps(render(asked), default=str)
    assert not any(value in text for value in SECRETS.values())


def test_the_launch_entry_names_the_render_digest_and_no_secret(tmp_path: Path):
    asked = request(tmp_path, "docker", SECRETS, SETTINGS["docker"])
    digest = render_digest(render_docker(asked))
    entry = parse_study_runtime({"format_version": 2, "studies": {"pathology": STUDY}},
                                "docker").entry("pathology")
    body = launch_body("docker", entry, {"image": "site/default:1", RENDER_DIGEST: digest},
                       "9.9")
    assert body[RENDER_DIGEST] == digest
    text = json.dumps(body)
    assert not any(value in text for value in SECRETS.values())
    assert "PATHOLOGY_DB_PASSWORD" not in text  # not even where the site keeps the secret
