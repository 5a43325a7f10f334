"""The ``quantize`` filter: where app.yaml may put it, a site that requires it, and FedAvg rounds
with it on, both ways (the sites' updates and the server's model), through the real client
runtime and serde, counting the bytes that cross the in-memory federation."""

from __future__ import annotations

import json
import struct
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from atoll.cli.job_init import init_command
from atoll.fl.model import Model
from atoll.fl.serde import encode, load_file
from atoll.fl.simulator import Federation, simulate
from atoll.spec.errors import SpecError
from atoll.spec.privacy import (
    ClipFilter,
    GaussianFilter,
    PrivacySettings,
    QuantizeFilter,
    parse_privacy,
    parse_site_policy,
    policy_violations,
)

from .sites import run_private

QUANTIZE = {"type": "quantize"}


def _refusal(section: dict) -> str:
    with pytest.raises(SpecError) as refused:
        parse_privacy(section, "app.yaml")
    return str(refused.value)


def test_quantize_is_the_last_filter_and_its_defaults():
    assert "reply[0]: quantize must be the last filter" in _refusal(
        {"filters": {"reply": [QUANTIZE, {"type": "clip", "max_norm": 1.0}]}})
    assert "task[0]: quantize must be the last filter" in _refusal(
        {"filters": {"task": [QUANTIZE, {"type": "exclude", "patterns": ["x"]}]}})
    assert "privacy.filters.reply[0].quantize.bits: must be one of 8" in _refusal(
        {"filters": {"reply": [{"type": "quantize", "bits": 4}]}})
    assert "privacy.filters.reply[0].quantize.block_size" in _refusal(
        {"filters": {"reply": [{"type": "quantize", "block_size": 8}]}})
    settings = parse_privacy({"filters": {"reply": [QUANTIZE]}}, "app.yaml")
    assert settings.filters.reply == [QuantizeFilter(type="quantize", bits=8, block_size=256,
                                                     min_elements=1024)]
    assert settings.changes_updates  # the sites send updates, which quantize far better


def test_client_dp_noise_is_added_before_the_update_is_quantized():
    settings = parse_privacy({"filters": {"reply": [QUANTIZE]},
                              "dp": {"clip_norm": 1.0, "noise_multiplier": 0.5}}, "app.yaml")
    assert [type(f) for f in settings.reply_pipeline()] == [ClipFilter, GaussianFilter,
                                                            QuantizeFilter]


def test_quantize_and_secure_aggregation_are_refused_together():
    assert "quantize cannot follow secure aggregation's masking" in _refusal(
        {"filters": {"reply": [QUANTIZE]}, "secure_aggregation": {}})
    # the model the server sends may still travel quantized
    parse_privacy({"filters": {"task": [QUANTIZE]}, "secure_aggregation": {}}, "app.yaml")


def test_a_site_that_requires_quantized_updates_names_the_rule():
    policy = parse_site_policy({"format_version": 1, "require": {"quantize": True}})
    without = policy_violations(PrivacySettings(), policy)
    assert [str(v) for v in without] == [
        "rule require.quantize: this site sends its updates 8-bit quantized; add "
        "{type: quantize} last in privacy.filters.reply"]
    task_only = PrivacySettings.model_validate({"filters": {"task": [QUANTIZE]}})
    assert [v.rule for v in policy_violations(task_only, policy)] == ["require.quantize"]
    assert policy_violations(PrivacySettings.model_validate(
        {"filters": {"reply": [QUANTIZE]}}), policy) == []


# --- rounds with it on ----------------------------------------------------------------------


class CountingFederation(Federation):
    """The simulator's federation, counting the bytes of each task and reply it carries."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bytes: dict[str, int] = defaultdict(int)

    def send(self, targets, topic, headers, payload):  # noqa: ANN001 - Federation's own
        chunks = [bytes(c) for c in payload]
        self.bytes[f"task {topic}"] += sum(map(len, chunks)) * len(targets)
        return super().send(targets, topic, headers, chunks)

    def reply(self, site, task_id, headers, payload):  # noqa: ANN001
        chunks = [bytes(c) for c in payload]
        self.bytes[f"reply {headers['topic']}"] += sum(map(len, chunks))
        return super().reply(site, task_id, headers, chunks)


INITIAL = {"w": np.random.default_rng(0).normal(0, 1, (128, 256)).astype(np.float32),
           "b": np.zeros(16, np.float32)}
DELTAS = {site: {"w": np.random.default_rng(i).normal(0, 0.1, (128, 256)).astype(np.float32),
                 "b": np.full(16, 0.5 * i, np.float32)} for i, site in enumerate(["s1", "s2"], 1)}


def _rounds(tmp_path: Path, settings: PrivacySettings | None, received: dict[str, list]):
    def trainer(site: str):
        def train(model: Model) -> Model:
            received[site].append({k: v.copy() for k, v in model.params.items()})
            return Model(params={k: v + DELTAS[site][k] for k, v in model.params.items()},
                         num_examples=10 * len(site), metrics={"loss": 0.5})
        return train

    federation = CountingFederation(list(DELTAS), tmp_path)
    _, errors = run_private(settings, {site: trainer(site) for site in DELTAS}, tmp_path,
                            INITIAL, rounds=2, federation=federation)
    assert errors == {}
    return federation.bytes, load_file(tmp_path / "global_model_final.safetensors").params


def test_fedavg_with_quantized_exchange_both_ways(tmp_path):
    received: dict[str, list] = defaultdict(list)
    settings = PrivacySettings.model_validate(
        {"filters": {"task": [QUANTIZE], "reply": [QUANTIZE]}})
    sent, final = _rounds(tmp_path / "q8", settings, received)
    plain_sent, exact = _rounds(tmp_path / "plain", PrivacySettings(), defaultdict(list))

    # a quarter of the float32 bytes each way (plus the lo/step tables and the headers)
    assert sent["reply train"] <= 0.27 * plain_sent["reply train"]
    assert sent["task train"] <= 0.27 * plain_sent["task train"]
    # the sites trained from the model decoded in its own dtype, within half a step of it
    first = received["s1"][0]
    assert first["w"].dtype == np.float32 and first["w"].shape == (128, 256)
    step = np.ptp(INITIAL["w"]) / 255
    assert 0 < np.abs(first["w"] - INITIAL["w"]).max() <= step / 2 + 1e-6
    np.testing.assert_array_equal(first["b"], INITIAL["b"])  # tiny: as it was
    # the server kept its own exact model and added the decoded updates: the final model is
    # within a step of the sites' updates (2 rounds, half a step each) of the exact one
    update_step = max(np.ptp(d["w"]) for d in DELTAS.values()) / 255
    error = np.abs(final["w"] - exact["w"]).max()
    assert 1e-4 < error <= update_step + 1e-6  # quantized: far above float32 rounding
    np.testing.assert_allclose(final["b"], exact["b"], rtol=1e-6)


def test_a_malformed_quantized_update_is_refused_and_the_round_goes_on(tmp_path):
    """A hostile site's reply with a NaN step: rejected from the round with the reason; the
    honest site's update makes the round."""
    federation = Federation(["honest", "hostile"], tmp_path)

    def hostile() -> None:
        channel = federation.site_channel("hostile")
        while (task := channel.receive(timeout=60)) is not None:
            list(task.chunks)
            if task.topic != "train":
                channel.reply(task.task_id, {"topic": task.topic}, encode(
                    Model(metrics={"accuracy": 0.0}, num_examples=1)))
                continue
            update = Model(params={k: np.ones_like(v) for k, v in INITIAL.items()},
                           params_type="diff", num_examples=1000)
            blob = bytearray(b"".join(encode(update, quantize=QuantizeFilter(type="quantize"))))
            (n,) = struct.unpack("<Q", blob[:8])
            blob[8 + n + 4 : 8 + n + 8] = np.float32(np.nan).tobytes()  # the first block's step
            channel.reply(task.task_id, {"topic": "train", "round": task.headers.get("round")},
                          [bytes(blob)])

    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    settings = PrivacySettings.model_validate({"filters": {"reply": [QUANTIZE]}})
    _, errors = run_private(settings, {"honest": lambda m: Model(
        params={k: v + DELTAS["s1"][k] for k, v in m.params.items()}, num_examples=10)},
        tmp_path, INITIAL, rounds=1, min_clients=1, federation=federation)
    thread.join(timeout=30)
    assert errors == {}
    rounds = [e for e in federation.events if e.get("event") == "round" and "failed" in e]
    assert rounds and rounds[0]["failed"] == {"hostile": (
        "sent an unreadable model: quantized payload refused: tensor 'w': a block's lo or step "
        "is not finite")}
    final = load_file(tmp_path / "global_model_final.safetensors").params["w"]
    assert np.abs(final - (INITIAL["w"] + DELTAS["s1"]["w"])).max() < 0.01  # honest alone


JOB_PRIVACY = """
privacy:
  filters:
    task: [{type: quantize, block_size: 16, min_elements: 1}]
    reply: [{type: quantize, block_size: 16, min_elements: 1}]
"""
MODEL_PY = """
import numpy as np
from atoll.fl.model import Model

def make():
    return Model(params={"w": np.zeros(10), "b": np.zeros(())})
"""


def _numpy_job(folder: Path, quantized: bool) -> Path:
    """The numpy template's job (atoll job init) with a first global model, and the filter on
    its tiny tensors (min_elements: 1)."""
    result = CliRunner().invoke(init_command, [str(folder), "--framework", "numpy"])
    assert result.exit_code == 0, result.output
    app = folder / "app" / "app.yaml"
    text = app.read_text().replace("num_rounds: 5", "num_rounds: 3")
    text = text.replace("  # initial_model: model.py:make", "  initial_model: model.py:make", 1)
    app.write_text(text + (JOB_PRIVACY if quantized else ""))
    (folder / "app" / "model.py").write_text(MODEL_PY)
    return folder


def test_the_numpy_template_job_simulates_with_the_filter_on(tmp_path):
    sites = {"site-1": {}, "site-2": {}}
    runs = {}
    for quantized in (True, False):
        job = _numpy_job(tmp_path / f"job-{quantized}", quantized)
        runs[quantized] = simulate(job, sites, results_dir=tmp_path / f"out-{quantized}")
    q8 = load_file(runs[True].results_dir / "global_model_final.safetensors").params
    exact = load_file(runs[False].results_dir / "global_model_final.safetensors").params
    assert q8["w"].dtype == np.float64 and q8["b"].shape == ()
    assert not np.array_equal(q8["w"], exact["w"])  # the exchange really was quantized
    np.testing.assert_allclose(q8["w"], exact["w"], atol=0.02)  # and close to the exact one
    rows = [json.loads(line) for line in
            (runs[True].results_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = [r["metrics"]["accuracy"] for r in rows
                if r["phase"] == "validate" and r["site"] == "global"]
    assert len(accuracy) == 3 and accuracy[-1] >= 0.7
