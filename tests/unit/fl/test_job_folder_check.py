"""The checks of `atoll job validate` (and of submit and simulate): every problem of a job
folder once, under the path the user typed, before anything runs."""

from __future__ import annotations

import json

import pytest
import yaml

from atoll.cli.job_init import render_job
from atoll.fl.job_folder_check import check_job, copy_with_overrides, parse_overrides
from atoll.spec.errors import SpecError


def _job(tmp_path, workflow="fedavg", sites=()):
    job = tmp_path / "myjob"
    for relative, text in render_job("myjob", workflow, list(sites), "numpy").items():
        (job / relative).parent.mkdir(parents=True, exist_ok=True)
        (job / relative).write_text(text)
    return job


def _lines(problems):
    return [": ".join(x for x in (p["file"], p["path"], p["message"]) if x) for p in problems]


@pytest.mark.parametrize("workflow", ["fedavg", "fedopt", "fedprox", "scatter_gather"])
def test_a_template_passes(tmp_path, workflow):
    assert check_job(_job(tmp_path, workflow), "default", ["site-1", "site-2"]) == []


def test_every_problem_is_named_once_under_the_users_path(tmp_path, monkeypatch):
    job = _job(tmp_path)
    app_yaml = job / "app" / "app.yaml"
    app_yaml.write_text(app_yaml.read_text().replace("num_rounds", "num_round"))
    (job / "app" / "helper.py").write_text("def broken(:\n")
    (job / "app" / "train.py").unlink()
    monkeypatch.chdir(tmp_path)
    lines = _lines(check_job(job.relative_to(tmp_path)))
    assert lines == [
        "myjob/app/app.yaml: server.args.num_rounds: Field required",
        "myjob/app/app.yaml: server.args.num_round: unknown key (allowed: min_clients, "
        "round_timeout, num_rounds, key_metric, key_metric_mode, evaluate_every, "
        "cross_site_eval, aggregator, trim_fraction, accumulator)",
        "myjob/app/app.yaml: site.script: 'train.py' is not a file in myjob/app/",
        "myjob/app/helper.py: line 1: SyntaxError: invalid syntax",
    ]


def test_a_missing_script_and_a_missing_section(tmp_path, monkeypatch):
    job = _job(tmp_path)
    (job / "app" / "train.py").unlink()
    monkeypatch.chdir(tmp_path)
    assert _lines(check_job(job.relative_to(tmp_path))) == [
        "myjob/app/app.yaml: site.script: 'train.py' is not a file in myjob/app/"]
    data = yaml.safe_load((job / "app" / "app.yaml").read_text())
    del data["site"]
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(data))
    assert [p["path"] for p in check_job(job)] == ["site"]


def test_an_initial_model_function_that_does_not_exist(tmp_path):
    job = _job(tmp_path)
    (job / "app" / "model.py").write_text("def make():\n    return {}\n")
    data = yaml.safe_load((job / "app" / "app.yaml").read_text())
    data["server"]["initial_model"] = "model.py:build"
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(data))
    [problem] = check_job(job)
    assert problem["path"] == "server.initial_model"
    assert problem["message"] == "model.py defines no function 'build'"


def test_min_clients_and_sites_against_the_study(tmp_path):
    job = _job(tmp_path, sites=["site-1", "site-3"])
    meta = json.loads((job / "meta.json").read_text())
    meta["mandatory_clients"] = ["site-3"]
    (job / "meta.json").write_text(json.dumps(meta))
    found = {p["path"]: p["message"] for p in check_job(job, "trial", ["site-1", "site-2"])}
    assert found["deploy_map.app[2]"].startswith("site 'site-3' is not enrolled in study 'trial'")
    assert found["mandatory_clients[0]"].startswith("site 'site-3' is not enrolled in study 'trial'")
    assert found["min_clients"].startswith("2, but the job can reach only 1 site(s) of study "
                                           "'trial' (site-1)")
    assert check_job(job) == []  # without a study, nothing to check against


def test_overrides_are_checked_where_they_apply(tmp_path):
    job = _job(tmp_path)
    assert parse_overrides(["num_rounds=3", "site.config.lr=0.1", "key_metric=loss"]) == {
        ("server.args", "num_rounds"): 3, ("site.config", "lr"): 0.1,
        ("server.args", "key_metric"): "loss"}
    assert check_job(job, overrides=parse_overrides(["num_rounds=3"])) == []
    [bad] = check_job(job, overrides=parse_overrides(["num_rounds=zero"]))
    assert (bad["file"], bad["path"]) == ("--set", "server.args.num_rounds")
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_overrides(["num_rounds"])


def test_a_copy_carries_the_overrides(tmp_path):
    job = _job(tmp_path)
    copy = copy_with_overrides(job, tmp_path / "copy", parse_overrides(
        ["num_rounds=2", "site.config.epochs=4"]))
    data = yaml.safe_load((copy / "app" / "app.yaml").read_text())
    assert data["server"]["args"]["num_rounds"] == 2 and data["site"]["config"] == {"epochs": 4}
    assert yaml.safe_load((job / "app" / "app.yaml").read_text())["server"]["args"][
        "num_rounds"] == 5  # the user's own folder is unchanged
