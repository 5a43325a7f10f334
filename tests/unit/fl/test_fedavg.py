"""FedAvg: the example-weighted mean of the sites' results, computed as they arrive."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from atoll.fl.aggregation import AggregateCorrupted, ResultRejected, WeightedMean, weighted_metrics
from atoll.fl.app_config import FedAvgArgs
from atoll.fl.model import Model
from atoll.fl.serde import encode, load_file, open_model
from atoll.fl.workflows import run_fedavg

from .helpers import fixed_result, run_workflow

SHAPES = {"w": (3, 4), "b": (4,), "s": ()}
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


def _params(draw_array):
    return {k: draw_array(shape) for k, shape in SHAPES.items()}


@st.composite
def site_results(draw):
    n_sites = draw(st.integers(1, 6))
    results = []
    for _ in range(n_sites):
        params = {
            k: draw(arrays(np.float64, shape, elements=finite)) for k, shape in SHAPES.items()
        }
        results.append(
            (params, draw(st.integers(1, 10_000)), draw(st.sampled_from(["full", "diff"])))
        )
    reference = {k: draw(arrays(np.float64, shape, elements=finite)) for k, shape in SHAPES.items()}
    return results, reference


@settings(max_examples=200, deadline=None)
@given(site_results(), st.lists(st.booleans(), min_size=6, max_size=6), st.integers(8, 64),
       st.sampled_from([7, 8, 12, 64, 4096]))
def test_weighted_mean_equals_the_example_weighted_mean(case, streamed, block_bytes, chunk):
    results, reference = case
    mean = WeightedMean({k: v.copy() for k, v in reference.items()})
    for (params, n, kind), as_stream in zip(results, streamed, strict=False):
        copy = {k: v.copy() for k, v in params.items()}
        model = Model(params=copy, num_examples=n, params_type=kind)
        if as_stream:  # folded in block by block while "arriving", in blocks of a few elements
            # Chunks of 7 or 12 bytes cut float64s in two (blocks are copied); of 8, 64 or
            # 4096, blocks are views of the chunks, some at unaligned addresses.
            chunks = (bytes(c) for c in encode(model, chunk_size=chunk))  # read-only, as a wire
            mean.add_stream(open_model(chunks), block_bytes=block_bytes)
        else:
            mean.add(model)
    got = mean.result()
    total = sum(n for _, n, _ in results)
    for key in SHAPES:
        expected = (
            sum(
                n * (p[key] + reference[key] if kind == "diff" else p[key])
                for p, n, kind in results
            )
            / total
        )
        np.testing.assert_allclose(got[key], expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.integers(0, 2**31)), min_size=2, max_size=4))
def test_the_fedavg_workflow_produces_the_weighted_mean(tmp_path_factory, sites):
    tmp = tmp_path_factory.mktemp("fedavg")
    handlers, expected, total = {}, 0.0, 0
    for i, (n, seed) in enumerate(sites):
        params = {"w": np.random.default_rng(seed).normal(size=(5, 3)).astype(np.float32)}
        handlers[f"site-{i}"] = fixed_result(params, n)
        expected = expected + n * params["w"].astype(np.float64)
        total += n
    run_workflow(run_fedavg, FedAvgArgs(num_rounds=1, cross_site_eval="none"), handlers, tmp)
    final = load_file(tmp / "global_model_final.safetensors")
    np.testing.assert_allclose(final.params["w"], expected / total, rtol=1e-6, atol=1e-6)
    assert final.params["w"].dtype == np.float32


def test_a_streamed_result_is_never_held_whole():
    big = {"w": np.ones(8 * 1024 * 1024, np.float32)}  # 32 MiB
    mean = WeightedMean({"w": np.zeros_like(big["w"])})
    mean.add_stream(open_model(encode(Model(params=big, num_examples=1))))
    blob = [bytes(c) for c in encode(Model(params={"w": big["w"] * 3}, num_examples=3))]
    tracemalloc.start()
    mean.add_stream(open_model(iter(blob)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # a block buffer, not a 32 MiB copy of the result
    np.testing.assert_allclose(mean.result()["w"][:3], [2.5, 2.5, 2.5])


def test_a_stream_breaking_off_mid_data_corrupts_the_round_loudly():
    mean = WeightedMean({"w": np.zeros(1000)})
    blob = b"".join(bytes(c) for c in encode(Model(params={"w": np.ones(1000)}, num_examples=1)))
    with pytest.raises(
        AggregateCorrupted, match="broke off while being added .*payload ended early"
    ):
        mean.add_stream(open_model(iter([blob[:-100]])), block_bytes=800)
    with pytest.raises(ResultRejected, match="num_examples=0"):  # header problems come first
        mean.add_stream(open_model(encode(Model(params={"w": np.ones(1000)}))))


def test_integer_params_are_averaged_and_rounded():
    mean = WeightedMean()
    mean.add(Model(params={"count": np.array(10, np.int64)}, num_examples=1))
    mean.add(Model(params={"count": np.array(13, np.int64)}, num_examples=2))
    result = mean.result()["count"]
    assert result.dtype == np.int64 and int(result) == 12


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (Model(params={"w": np.ones(2)}, num_examples=0), "num_examples=0"),
        (Model(num_examples=3), "sent no params"),
        (Model(params={"v": np.ones(2)}, num_examples=3), r"missing \['w'\], unexpected \['v'\]"),
        (Model(params={"w": np.ones(3)}, num_examples=3), r"shape \[3\], the global model \[2\]"),
    ],
)
def test_unusable_results_are_rejected_with_what_to_change(model, message):
    with pytest.raises(ResultRejected, match=message):
        WeightedMean({"w": np.zeros(2)}).add(model)


def test_a_diff_without_a_global_model_is_rejected():
    with pytest.raises(ResultRejected, match="no initial_model"):
        WeightedMean().add(Model(params={"w": np.ones(2)}, num_examples=1, params_type="diff"))


def test_weighted_metrics_average_what_each_site_reports():
    got = weighted_metrics([({"acc": 1.0, "loss": 2.0}, 3), ({"acc": 0.0}, 1)])
    assert got == {"acc": 0.75, "loss": 2.0}


def test_a_full_run_writes_models_metrics_and_the_best_model(tmp_path):
    accuracy = iter([0.5, 0.6, 0.9, 0.7, 0.8, 0.85, 0.4, 0.2, 0.3, 0.1])

    def site(topic, model):
        if topic == "validate":
            return Model(metrics={"accuracy": next(accuracy)}, num_examples=5)
        params = model.params or {"w": np.zeros(3)}
        return Model(params={"w": params["w"] + 1.0}, num_examples=10, metrics={"loss": 1.0})

    args = FedAvgArgs(num_rounds=3, cross_site_eval="global", key_metric="accuracy")
    federation = run_workflow(run_fedavg, args, {"a": site}, tmp_path)
    # three rounds of +1 from zero, and accuracy peaked (0.9) after the third validation
    np.testing.assert_array_equal(
        load_file(tmp_path / "global_model_final.safetensors").params["w"], 3.0
    )
    best = load_file(tmp_path / "global_model_best.safetensors")
    assert best.round == 3 and best.metrics["accuracy"] == 0.9
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], r["phase"], r["site"]) for r in rows[:4]] == [
        (1, "train", "a"),
        (1, "train", "global"),
        (1, "validate", "a"),
        (1, "validate", "global"),
    ]
    csv = (tmp_path / "metrics.csv").read_text().splitlines()
    assert (
        csv[0] == "round,phase,site,model,metric,value,step"
        and "3,validate,a,global,accuracy,0.9," in csv
    )
    assert (tmp_path / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    table = json.loads((tmp_path / "cross_site_eval.json").read_text())["table"]
    assert table == {"global_final": {"a": {"accuracy": 0.7}}}
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert [e["round"] for e in rounds] == [1, 2, 3]
    assert rounds[0]["sites"]["a"] == {
        "train": {"loss": 1.0},
        "num_examples": 10,
        "validate": {"accuracy": 0.5},
    }
    assert federation.events[-1]["event"] == "finished"


def test_cross_site_all_evaluates_every_site_model_on_every_site(tmp_path):
    def site(value):
        def handler(topic, model):
            if topic == "validate":
                return Model(metrics={"accuracy": float(model.params["w"][0])}, num_examples=1)
            return Model(params={"w": np.full(2, value)}, num_examples=1)

        return handler

    args = FedAvgArgs(num_rounds=1, evaluate_every=0, cross_site_eval="all")
    run_workflow(run_fedavg, args, {"a": site(1.0), "b": site(3.0)}, tmp_path)
    table = json.loads((tmp_path / "cross_site_eval.json").read_text())["table"]
    assert table == {
        "global_final": {"a": {"accuracy": 2.0}, "b": {"accuracy": 2.0}},
        "a": {"a": {"accuracy": 1.0}, "b": {"accuracy": 1.0}},
        "b": {"a": {"accuracy": 3.0}, "b": {"accuracy": 3.0}},
    }
