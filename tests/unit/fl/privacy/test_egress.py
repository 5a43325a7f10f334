"""The egress rule: whatever a workflow calls its tasks, what a site sends back passes the site's
rules (fl/privacy/egress.py, SitePrivacy.on_reply), and each DP release is accounted in the
study's ledger (here the simulator's MemoryLedger; the site parent's is tested in
tests/unit/site/test_privacy_ledger.py). Epsilons are compared with Opacus's RDP accountant
stepped here directly."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from atoll.fl.client_runtime import ClientSession, bind, unbind
from atoll.fl.metrics_log import LOGGED_KEY
from atoll.fl.model import Model
from atoll.fl.privacy import egress
from atoll.fl.privacy.accounting import BudgetExhausted
from atoll.fl.privacy.secagg.identity import LocalAuthority
from atoll.fl.privacy.site_privacy import PrivacyRefused, SitePrivacy
from atoll.fl.simulator import Federation, MemoryLedger
from atoll.fl.workflows.api import Context
from atoll.spec.budget_ledger import StudyBudget
from atoll.spec.privacy import parse_privacy, parse_site_policy

DP = parse_privacy({"dp": {"clip_norm": 1.0, "noise_multiplier": 4.0}}, "test")
POLICY = parse_site_policy({"format_version": 1,
                            "require": {"max_clip_norm": 1.0, "min_noise_multiplier": 1.0},
                            "budget": {"epsilon": 8.0, "delta": 1e-5}})
W = {"w": np.zeros((3, 3), np.float32)}
STEP = 0.5


def rdp_epsilon(noise: float, releases: int, delta: float = 1e-5) -> float:
    accountant = RDPAccountant()
    for _ in range(releases):
        accountant.step(noise_multiplier=noise, sample_rate=1.0)
    return float(accountant.get_epsilon(delta=delta))


def _changed(model: Model, **metrics) -> Model:
    model.metrics.update(metrics)
    return model


# --- the classifier -----------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "kind"), [
    (Model(params=W), egress.UPDATE),
    (Model(params=W, meta={"task": "train", "total_rounds": 3}), egress.UPDATE),
    (Model(metrics={"accuracy": 0.9}, num_examples=4), egress.METRICS),
    (Model(meta={"error": "not a statistics task: x"}), egress.METRICS),
    (Model(metrics={"loss": 1.0}, meta={LOGGED_KEY: [
        {"round": 1, "step": 3, "metrics": {"loss": 0.7}}]}), egress.METRICS),
    (Model(meta={"statistics": {"age": {"count": 10}}, "rules": {"min_count": 5}}),
     egress.STATISTICS),
    # what the policy cannot vouch for
    (Model(meta={"cohort": {"ages": [31.0, 47.0]}}), egress.UNKNOWN),
    (Model(params=W, meta={"statistics": {"age": {"count": 10}}}), egress.UNKNOWN),
    (Model(meta={"rules": {"min_count": 5}}), egress.UNKNOWN),
    (Model(meta={"note": "x" * (egress.MAX_TEXT + 1)}), egress.UNKNOWN),
    (Model(metrics={f"m{i}": 0.0 for i in range(egress.MAX_METRICS + 1)}), egress.UNKNOWN),
    (Model(meta={LOGGED_KEY: [{"round": 1, "metrics": {"w": [1.0, 2.0]}}]}), egress.UNKNOWN),
    (Model(meta={LOGGED_KEY: [{"round": 1, "weights": {}}]}), egress.UNKNOWN),
    # Model checks its metrics when made; the job's code may change them afterwards
    (_changed(Model(), embedding=[0.1, 0.2, 0.3]), egress.UNKNOWN),  # a vector, not a number
    (_changed(Model(), accuracy="0.9 on records 1-40"), egress.UNKNOWN),
    (Model(meta={"statistics": {"age": {"count": 10}}, "cohort": {"ages": [31.0]}}),
     egress.UNKNOWN),  # rows beside a statistics answer
    (Model(meta={f"k{i}": "x" * egress.MAX_TEXT for i in range(70)}), egress.UNKNOWN),  # 18 kB
])
def test_a_reply_is_classified_by_what_it_carries(model, kind):
    assert egress.classify(model)[0] == kind


# --- a hostile workflow in the simulator --------------------------------------------------------


def _site(federation: Federation, site: str, privacy: SitePrivacy, errors: dict[str, str]
          ) -> threading.Thread:
    def loop() -> None:
        session = ClientSession(federation.site_channel(site), site, privacy=privacy)
        bind(session, thread_only=True)
        try:
            while (model := session.receive()) is not None:
                if session.topic == "validate":
                    session.send(Model(metrics={"accuracy": 0.5}, num_examples=7))
                elif session.topic == "describe":
                    session.send(Model(meta={"cohort": {"ages": [31.25, 47.5]}}))
                else:  # the ordinary script: it trains on whatever else it is asked
                    session.send(Model(params={k: v + STEP for k, v in model.params.items()},
                                       num_examples=10))
        except Exception as exc:  # noqa: BLE001 - a site's failure is its drop-out
            errors[site] = f"{type(exc).__name__}: {exc}"
            federation.drop(site, errors[site])
        finally:
            unbind(thread_only=True)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _hostile(tmp_path, names, *, ledger: MemoryLedger | None = None, privacy=DP,
             policy=POLICY, job_id: str = "job-1"):
    federation = Federation(["s1"], tmp_path / job_id, job_id=job_id, ledger=ledger)
    errors: dict[str, str] = {}
    thread = _site(federation, "s1", SitePrivacy(privacy, policy, "s1", job_id), errors)
    ctx = Context(federation.server_channel(), {})
    seen = []
    try:
        for round_, name in names:
            got = ctx.gather(ctx.send(name, Model(params=W), round=round_), timeout=30,
                             min_replies=0, require_min=False)
            seen.append((name, got.results.get("s1"), got.failed.get("s1")))
    finally:
        federation.close()
        thread.join(timeout=30)
    return federation, seen, errors


def test_every_task_name_gets_the_sites_pipeline_and_each_release_is_accounted(tmp_path):
    names = [(r, n) for r in (1, 2) for n in ("train", "evaluate", "train2", "submit_model",
                                              "validate", "zq81") for _ in (0, 1)]
    federation, seen, errors = _hostile(tmp_path, names)
    assert errors == {}
    updates = [(name, m) for name, m, _ in seen if m is not None and m.params]
    assert len(updates) == 20  # all but validate, twice per round, two rounds
    for name, model in updates:
        assert model.params_type == "diff", name
        assert not np.allclose(model.params["w"], STEP), f"{name}: the raw update left the site"
        assert not np.allclose(model.params["w"], W["w"] + STEP), f"{name}: raw weights"
    [ledger] = federation.ledger.ledgers.values()
    assert ledger.spent["dp"]["job-1"][0] == pytest.approx(rdp_epsilon(4.0, 20), rel=1e-9)
    assert updates[-1][1].metrics["privacy_epsilon"] == pytest.approx(rdp_epsilon(4.0, 20))


def test_the_studys_budget_holds_across_jobs_and_the_refusal_names_the_ledger(tmp_path):
    one = parse_privacy({"dp": {"clip_norm": 1.0, "noise_multiplier": 1.0}}, "test")
    ledger = MemoryLedger(study="alpha", budgets={"s1": {"dp": StudyBudget(8.0, 1e-5, "test")}})
    _, seen, errors = _hostile(tmp_path, [(1, "train"), (2, "train")], ledger=ledger,
                               privacy=one, job_id="job-1")
    assert errors == {} and all(m is not None for _, m, _ in seen)
    _, seen, errors = _hostile(tmp_path, [(1, "train")], ledger=ledger, privacy=one,
                               job_id="job-2")
    assert seen[0][1] is None  # nothing was sent
    assert errors["s1"].startswith(
        "BudgetExhausted: privacy ledger of site s1, study alpha, kind dp")
    assert f"has spent epsilon {rdp_epsilon(1.0, 2):.4g}" in errors["s1"]
    assert "the budget epsilon 8.0" in errors["s1"]
    assert ledger.ledgers["s1"].spent["dp"] == {"job-1": [pytest.approx(rdp_epsilon(1.0, 2)),
                                                          1e-5]}


def test_a_reply_the_policy_cannot_classify_is_refused_where_the_site_requires_privacy(tmp_path):
    _, seen, errors = _hostile(tmp_path, [(1, "describe")])
    assert seen[0][1] is None and "cannot classify" in errors["s1"]
    _, seen, errors = _hostile(tmp_path, [(1, "describe")], policy=None)  # nothing required
    assert errors == {} and seen[0][1].meta["cohort"]["ages"] == [31.25, 47.5]


# --- secure aggregation -------------------------------------------------------------------------


AUTHORITY = LocalAuthority("tests")
SECURE = parse_privacy({"dp": {"clip_norm": 1.0, "noise_multiplier": 1.0},
                        "secure_aggregation": {"threshold": 2}}, "test")


def _secure() -> SitePrivacy:
    """A site's privacy under secure aggregation: its worker holds a site-certified key."""
    return SitePrivacy(SECURE, None, "s1", "job", identity=AUTHORITY.identity("s1", "job"))


def test_with_secure_aggregation_metrics_leave_without_the_example_count():
    privacy = _secure()
    out = privacy.on_reply("validate", Model(metrics={"accuracy": 0.5}, num_examples=7))
    assert out.num_examples == 0 and out.metrics == {"accuracy": 0.5}
    out = privacy.on_reply("describe", Model(meta={"statistics": {}}, num_examples=3))
    assert out.num_examples == 0


def test_with_secure_aggregation_an_update_never_leaves_unmasked():
    privacy = _secure()
    privacy.spend = lambda kind, eps, delta: eps
    privacy.on_task("submit_model", 1, Model(params=dict(W)))  # no shares with the task
    with pytest.raises(PrivacyRefused, match="leaves this site only masked"):
        privacy.on_reply("submit_model", Model(params={"w": W["w"] + STEP}, num_examples=10))


def test_one_rounds_shares_mask_one_update_only():
    privacy = _secure()
    privacy.spend = lambda kind, eps, delta: eps
    privacy._masked.add(1)  # round 1's update was masked and sent
    privacy._mask_round = 1  # and the workflow routed round 1's shares again
    with pytest.raises(PrivacyRefused, match="reveal the difference"):
        privacy.on_reply("train", Model(params={"w": W["w"] + STEP}, params_type="diff",
                                        num_examples=10))


def test_without_a_ledger_nothing_a_budget_covers_is_released():
    privacy = SitePrivacy(DP, POLICY, "s1", "job")
    privacy.on_task("train", 1, Model(params=dict(W)))
    with pytest.raises(BudgetExhausted, match="no privacy ledger"):
        privacy.on_reply("train", Model(params={"w": W["w"] + STEP}, num_examples=10))


def test_fresh_keys_for_a_round_let_it_run_again_but_never_after_its_unmask():
    """After a server restart the interrupted round runs again from its start: a new advertise
    step gives the round fresh keys, so one more masked update of it shares no mask with the
    one sent before; a round whose unmask step was answered never gets keys again."""
    from atoll.fl.privacy.secagg.client import ADVERTISE, SecAggRefused

    privacy = _secure()
    privacy._masked.add(1)  # round 1's update was masked and sent, then the server restarted
    privacy.answer(ADVERTISE, 1, Model())
    assert 1 not in privacy._masked
    privacy._masked.add(1)
    privacy.secagg.unmasked.add(1)  # its unmask step was answered
    with pytest.raises(SecAggRefused, match="unmasked already"):
        privacy.answer(ADVERTISE, 1, Model())
    assert 1 in privacy._masked
