"""A site's statistics rules (study_runtime.yaml ``statistics:``) are validated strictly and
reach its site workers, on every launcher, in an atoll-owned variable a study cannot set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atoll.launchers.base import JobIdentity
from atoll.launchers.docker_render import render_docker
from atoll.launchers.request import build_request
from atoll.spec.errors import SpecError
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.statistics_rules import RULES_ENV, StatisticsRules
from atoll.spec.study_runtime import parse_study_runtime

JOB_ID = "0123456789abcdef0123456789abcdef"


def _request(tmp_path: Path, study: dict, role: str = "site"):
    site_config = parse_site_config({"launcher": "docker", "docker": {"default_image": "trainer:1"}})
    runtime = parse_study_runtime({"format_version": 2, "studies": {"outcomes": study}}, "docker")
    meta = load_meta({"name": "job", "deploy_map": {"app": ["@ALL"]}})
    who = "site-a" if role == "site" else "server"
    return build_request(meta=meta, identity=JobIdentity(JOB_ID, "job", "outcomes", who, role),
                         site_config=site_config, study_runtime=runtime, workdir=tmp_path,
                         parent_address="127.0.0.1:7001", check_capacity=False)


def test_the_rules_reach_the_site_worker(tmp_path):
    request = _request(tmp_path, {"statistics": {"min_count": 25, "noise": 0.05}})
    sent = json.loads(request.worker_env[RULES_ENV])
    assert sent["min_count"] == 25 and sent["noise"] == 0.05
    assert StatisticsRules.model_validate(sent) == StatisticsRules(min_count=25, noise=0.05)
    rendered = json.dumps(render_docker(request))  # what the container gets, on docker
    assert RULES_ENV in rendered
    assert RULES_ENV not in _request(tmp_path, {"statistics": {"min_count": 25}},
                                     role="server").worker_env


def test_no_rules_no_variable(tmp_path):
    assert RULES_ENV not in _request(tmp_path, {}).worker_env


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        ({"min_count": 0}, "min_count"),
        ({"noise": 1.5}, "noise"),
        ({"min_count": "10"}, "min_count"),
        ({"epsilon": 1}, "epsilon"),
    ],
)
def test_bad_rules_are_named(rules, problem):
    with pytest.raises(SpecError) as failure:
        parse_study_runtime({"format_version": 2, "studies": {"outcomes": {"statistics": rules}}},
                            "docker")
    assert f"studies.outcomes.statistics.{problem}" in str(failure.value)


def test_a_study_cannot_set_the_variable_itself():
    with pytest.raises(SpecError, match=RULES_ENV):
        parse_study_runtime({"format_version": 2, "studies": {"outcomes": {
            "env": {RULES_ENV: '{"min_count": 1}'}}}}, "docker")
