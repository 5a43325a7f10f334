"""A site's required privacy policy (local/privacy.yaml): a weaker job is refused, naming the
rule, by the site parent's check and again by the site worker; a broken file names its field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atoll.fl.privacy.accounting import epsilon
from atoll.fl.privacy.site_privacy import PrivacyRefused, SitePrivacy, policy_from_env
from atoll.site.job_acceptance import JobRefused, check_privacy
from atoll.spec.errors import SpecError
from atoll.spec.privacy import (
    PrivacySettings,
    load_site_policy,
    parse_site_policy,
    policy_violations,
)
from atoll.spec.worker_env import PRIVACY_POLICY as POLICY_ENV

from .sites import adds, run_private

STRICT = parse_site_policy({"format_version": 1,
                            "require": {"exclude": ["head.*"], "max_clip_norm": 1.0,
                                        "min_noise_multiplier": 0.8, "secure_aggregation": True},
                            "budget": {"epsilon": 20.0, "delta": 1e-5}})
COMPLIANT = {"filters": {"reply": [{"type": "exclude", "patterns": ["head.*"]}]},
             "dp": {"clip_norm": 0.5, "noise_multiplier": 1.0},
             "secure_aggregation": {}}


def _rules(job: dict) -> list[str]:
    return [v.rule for v in policy_violations(PrivacySettings.model_validate(job), STRICT)]


def test_a_job_asking_nothing_breaks_every_rule():
    assert _rules({}) == ["require.exclude", "require.max_clip_norm",
                          "require.min_noise_multiplier", "require.secure_aggregation",
                          "budget.epsilon"]


def test_a_compliant_job_passes_and_each_weakening_is_named():
    assert _rules(COMPLIANT) == []
    looser = {**COMPLIANT, "dp": {"clip_norm": 2.0, "noise_multiplier": 1.0}}
    assert _rules(looser) == ["require.max_clip_norm"]
    quieter = {**COMPLIANT, "dp": {"clip_norm": 0.5, "noise_multiplier": 0.5}}
    assert _rules(quieter) == ["require.min_noise_multiplier"]
    central = {**COMPLIANT, "secure_aggregation": None,
               "dp": {"mode": "server", "clip_norm": 0.5, "noise_multiplier": 1.0}}
    # clipping and noise the server adds are not the site's: its reply leaves raw
    assert _rules(central) == ["require.max_clip_norm", "require.min_noise_multiplier",
                               "require.secure_aggregation", "budget.epsilon"]


def test_noise_added_before_a_later_clip_does_not_count():
    job = {**COMPLIANT, "dp": None, "filters": {"reply": [
        {"type": "exclude", "patterns": ["head.*"]},
        {"type": "clip", "max_norm": 1.0}, {"type": "gaussian", "noise_multiplier": 2.0},
        {"type": "clip", "max_norm": 0.5}]}}
    assert _rules(job) == ["require.min_noise_multiplier", "budget.epsilon"]


def test_the_site_parent_refuses_a_weaker_job_naming_the_rule(tmp_path):
    local, app = tmp_path / "local", tmp_path / "app"
    local.mkdir()
    app.mkdir()
    (local / "privacy.yaml").write_text(
        "format_version: 1\nrequire: {max_clip_norm: 1.0, min_noise_multiplier: 0.8}\n")
    (app / "app.yaml").write_text(
        "site: {script: train.py}\nprivacy:\n  dp: {clip_norm: 5.0, noise_multiplier: 1.0}\n")
    with pytest.raises(JobRefused) as refused:
        check_privacy("hospital-1", local, app)
    assert str(refused.value).startswith(
        "hospital-1 refused the job by its privacy policy (local/privacy.yaml): rule "
        "require.max_clip_norm: replies must be clipped to an L2 norm of at most 1.0; the job "
        "clips to 5.0")
    (app / "app.yaml").write_text(
        "site: {script: train.py}\nprivacy:\n  dp: {clip_norm: 1.0, noise_multiplier: 1.0}\n")
    check_privacy("hospital-1", local, app)  # complies: no error


def test_a_broken_policy_file_names_its_field(tmp_path):
    (tmp_path / "privacy.yaml").write_text("format_version: 1\nrequire: {max_clip: 1}\n")
    with pytest.raises(SpecError) as broken:
        load_site_policy(tmp_path)
    assert "local/privacy.yaml" in str(broken.value) and "require.max_clip" in str(broken.value)


def test_the_worker_refuses_a_weaker_job_whatever_its_parent_did(monkeypatch):
    monkeypatch.setenv(POLICY_ENV, STRICT.model_dump_json())
    policy = policy_from_env()
    assert policy == STRICT
    with pytest.raises(PrivacyRefused, match="rule require.secure_aggregation"):
        SitePrivacy(PrivacySettings.model_validate({**COMPLIANT, "secure_aggregation": None}),
                    policy, "hospital-1", "job")


def test_a_site_stops_sending_once_its_budget_would_be_passed(tmp_path):
    budget = epsilon(1.0, 2, 1e-5) + 1e-6  # two rounds' worth, not three
    policy = parse_site_policy({"format_version": 1, "budget": {"epsilon": budget}})
    settings = PrivacySettings.model_validate({"dp": {"clip_norm": 10.0, "noise_multiplier": 1.0}})
    initial = {"w": np.zeros(3, np.float32)}
    trainers = {s: adds({"w": np.ones(3, np.float32)}, 5) for s in ("a", "b")}
    federation, errors = run_private(settings, trainers, tmp_path, initial, rounds=3,
                                     min_clients=1, policies={"a": policy})
    assert errors["a"].startswith("BudgetExhausted: privacy budget of site a (local/privacy.yaml "
                                  "budget.epsilon) exhausted: after 2 update(s) epsilon is")
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert [sorted(e["sites"]) for e in rounds] == [["a", "b"], ["a", "b"], ["b"]]
    sent = [e["sites"]["a"]["train"]["privacy_epsilon"] for e in rounds[:2]]
    assert sent == [pytest.approx(epsilon(1.0, k, 1e-5)) for k in (1, 2)]


def test_the_job_stops_when_its_own_budget_would_be_passed(tmp_path):
    settings = PrivacySettings.model_validate({"dp": {
        "clip_norm": 10.0, "noise_multiplier": 1.0, "max_epsilon": epsilon(1.0, 2, 1e-5) + 1e-6}})
    initial = {"w": np.zeros(3, np.float32)}
    trainers = {s: adds({"w": np.ones(3, np.float32)}, 5) for s in ("a", "b")}
    federation, errors = run_private(settings, trainers, tmp_path, initial, rounds=5)
    assert errors == {}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped"].startswith("privacy budget of the job (app.yaml "
                                         "privacy.dp.max_epsilon) exhausted: after 2 update(s)")
    assert summary["privacy"]["epsilon"] == pytest.approx(epsilon(1.0, 2, 1e-5))
    assert summary["privacy"]["rounds"] == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    privacy = [r for r in rows if r["phase"] == "privacy"]
    assert [r["round"] for r in privacy] == [1, 2]
    assert privacy[1]["metrics"] == {"epsilon": pytest.approx(epsilon(1.0, 2, 1e-5)),
                                     "delta": 1e-5}
    assert any(e["event"] == "stopped" for e in federation.events)


def test_a_job_without_privacy_settings_is_refused_by_a_strict_site_at_start(monkeypatch):
    from atoll.fl.app_config import parse_app_config
    from atoll.fl.runner import _site_privacy

    config, _ = parse_app_config({"site": {"script": "train.py"}})
    assert config.privacy is None
    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert _site_privacy(config, "hospital-1", "job", None) is None  # nothing asked of it
    monkeypatch.setenv(POLICY_ENV, STRICT.model_dump_json())
    with pytest.raises(PrivacyRefused, match="rule require.secure_aggregation"):
        _site_privacy(config, "hospital-1", "job", None)
