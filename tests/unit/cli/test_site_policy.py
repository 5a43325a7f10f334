"""`atoll site validate|render|approve` and local/authorization.json, on a site folder as an
operator has it: every problem named with its path, exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.site_policy import approve_command
from atoll.cli.site_render import render_command, validate_command

SEED = Path(__file__).parents[2] / "fixtures/seed"


@pytest.fixture
def kit(tmp_path):
    local = tmp_path / "hospital-a" / "local"
    local.mkdir(parents=True)
    shutil.copy(SEED / "site_process.yaml", local / "site.yaml")
    shutil.copy(SEED / "study_runtime_process.yaml", local / "study_runtime.yaml")
    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    shutil.copy(SEED / "meta.json", job / "meta.json")
    return local.parent, job


def run(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


def policy(site_dir: Path, **doc) -> None:
    (site_dir / "local" / "authorization.json").write_text(json.dumps(
        {"format_version": "1.0", "permissions": {"lead": "any"}, **doc}))


def render(site_dir, job, *args):
    return run(render_command, site_dir, job, "--study", "pathology", "--format", "json", *args)


def test_validate_checks_the_policy(kit):
    site_dir, _ = kit
    policy(site_dir, permissions={"lead": {"submit_job": "maybe"}}, code_approval="sometimes")
    result = run(validate_command, site_dir, "--format", "json")
    assert result.exit_code == 2
    errors = json.loads(result.stdout)["error"]["problems"]
    assert {(e["file"], e["path"]) for e in errors} == {
        ("local/authorization.json", "permissions.lead.submit_job"),
        ("local/authorization.json", "code_approval")}


def test_render_says_who_the_policy_lets_run_the_job(kit):
    site_dir, job = kit
    policy(site_dir, permissions={"lead": {"submit_job": "any", "byoc": "n:submitter"},
                                  "member": {"submit_job": "none"}})
    result = render(site_dir, job, "--org", "hospital-a")
    assert result.exit_code == 0, result.output
    auth = json.loads(result.stdout)["authorization"]
    assert auth["allowed"] and [r["rule"] for r in auth["rules"]] == [
        "permissions.lead.submit_job", "permissions.lead.byoc"]
    result = render(site_dir, job, "--role", "member")
    assert result.exit_code == 2
    paths = [e["path"] for e in json.loads(result.stdout)["error"]["problems"]]
    assert paths == ["permissions.member.submit_job", "permissions.member"]


def test_o_site_needs_the_sites_kit_for_its_org(kit):
    site_dir, job = kit  # local/ only: no certificate, no org
    policy(site_dir, permissions={"lead": {"submit_job": "o:site", "byoc": "any"}})
    errors = json.loads(render(site_dir, job, "--org", "hospital-a").stdout)["error"]["problems"]
    assert "this site's org is unknown: pass the site's kit folder" in errors[0]["message"]


def test_a_site_in_approval_mode_renders_only_approved_jobs(kit):
    site_dir, job = kit
    policy(site_dir, code_approval="required")
    refused = json.loads(render(site_dir, job).stdout)["error"]["problems"]
    assert "is not approved; after review, approve it with `atoll site approve" in \
        refused[0]["message"]
    approved = run(approve_command, site_dir, job, "--format", "json")
    assert approved.exit_code == 0, approved.output
    answer = json.loads(approved.stdout)
    assert answer["added"] and answer["approval_required"]
    assert answer["digest"] in (site_dir / "local" / "approved_jobs.json").read_text()
    result = render(site_dir, job)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["authorization"]["digest"] == answer["digest"]
    again = run(approve_command, site_dir, job)
    assert again.stdout.startswith("already approved: job")
    (job / "app" / "train.py").write_text("changed after review\n")
    assert render(site_dir, job).exit_code == 2


def test_approve_notes_a_site_that_does_not_require_approval(kit):
    site_dir, job = kit
    result = run(approve_command, site_dir, job)
    assert result.exit_code == 0
    assert "does not set code_approval: required" in result.stderr


def test_validate_checks_and_summarizes_the_privacy_policy(kit):
    site_dir, _ = kit
    privacy = site_dir / "local" / "privacy.yaml"
    privacy.write_text("format_version: 1\nrequire: {max_clip: 1.0}\nbudget: {epsilon: -1}\n")
    result = run(validate_command, site_dir, "--format", "json")
    assert result.exit_code == 2
    errors = json.loads(result.stdout)["error"]["problems"]
    assert {(e["file"], e["path"]) for e in errors} == {
        ("local/privacy.yaml", "require.max_clip"), ("local/privacy.yaml", "budget.epsilon")}
    privacy.write_text("format_version: 1\nrequire: {max_clip_norm: 1.0, secure_aggregation: "
                       "true}\nbudget: {epsilon: 8}\n")
    result = run(validate_command, site_dir)
    assert "local/privacy.yaml: ok; requires max_clip_norm 1.0, secure_aggregation True, budget " \
           "epsilon 8.0 at delta 1e-05" in result.output
    privacy.write_text("format_version: 1\nrequire: {secure_aggregation: true}\n"
                       "secure_aggregation: {min_participants: 1}\n")
    result = run(validate_command, site_dir, "--format", "json")
    assert result.exit_code == 2  # a secure sum of one site is no secure sum
    assert [e["path"] for e in json.loads(result.stdout)["error"]["problems"]] == [
        "secure_aggregation.min_participants"]
    privacy.write_text("format_version: 1\nrequire: {secure_aggregation: true}\n"
                       "secure_aggregation: {min_participants: 3}\n")
    result = run(validate_command, site_dir)
    assert "requires secure_aggregation True, secure aggregation with at least 3 sites" in \
        result.output
