"""FedAvg keeps one model in memory: the global model's buffers become the round's running sum."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from atoll.fl.aggregation import ResultRejected, WeightedMean
from atoll.fl.app_config import FedAvgArgs, FedOptArgs
from atoll.fl.model import Model
from atoll.fl.serde import decode, encode, load_file, open_model
from atoll.fl.simulator import Federation
from atoll.fl.workflows import run_fedavg, run_fedopt

from .helpers import run_workflow

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


def _buffer(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_the_first_full_result_is_folded_into_the_global_models_own_buffer():
    size = 8 * 1024 * 1024  # 32 MiB of float32
    reference = {"w": np.full(size, 7.0, np.float32)}
    address = _buffer(reference["w"])
    mean = WeightedMean(reference, reuse_reference=True)
    blobs = [
        [
            bytes(c)
            for c in encode(Model(params={"w": np.full(size, v, np.float32)}, num_examples=n))
        ]
        for v, n in ((1.0, 1), (4.0, 3))
    ]
    tracemalloc.start()
    for blob in blobs:
        mean.add_stream(open_model(iter(blob)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # block buffers only: no second 32 MiB array for the sum
    result = mean.result()["w"]
    assert _buffer(result) == address  # the average lives where the global model was
    np.testing.assert_allclose(result[:3], [3.25, 3.25, 3.25])


def test_without_reuse_the_global_model_is_left_untouched():
    reference = {"w": np.full(4, 7.0, np.float32)}
    mean = WeightedMean(reference)
    mean.add(Model(params={"w": np.ones(4, np.float32)}, num_examples=1))
    np.testing.assert_array_equal(reference["w"], np.full(4, 7.0, np.float32))
    assert mean.reference is reference


def test_a_diff_after_a_reused_full_result_is_rejected_with_what_to_change():
    mean = WeightedMean({"w": np.zeros(3)}, reuse_reference=True)
    mean.add(Model(params={"w": np.ones(3)}, num_examples=1))
    diff = Model(params={"w": np.ones(3)}, num_examples=1, params_type="diff")
    with pytest.raises(ResultRejected, match="send the same params_type .* from every site"):
        mean.add(diff)
    with pytest.raises(ResultRejected, match="send the same params_type"):
        mean.add_stream(open_model(encode(diff)))
    np.testing.assert_array_equal(mean.result()["w"], np.ones(3))  # the rejected one is not in it


def test_a_first_diff_keeps_the_global_model_for_the_rest_of_the_round():
    reference = {"w": np.full(3, 10.0)}
    mean = WeightedMean(reference, reuse_reference=True)
    mean.add(Model(params={"w": np.ones(3)}, num_examples=1, params_type="diff"))  # 11
    mean.add(Model(params={"w": np.full(3, 2.0)}, num_examples=1))  # full: 2
    mean.add(Model(params={"w": np.ones(3)}, num_examples=2, params_type="diff"))  # 11, twice
    np.testing.assert_allclose(mean.result()["w"], np.full(3, (11 + 2 + 22) / 4))


def test_integer_and_half_precision_params_get_their_own_accumulator():
    reference = {"n": np.array([4, 8], np.int64), "h": np.ones(2, np.float16)}
    mean = WeightedMean({k: v.copy() for k, v in reference.items()}, reuse_reference=True)
    mean.add(Model(params={"n": np.array([1, 2]), "h": np.full(2, 3, np.float16)}, num_examples=1))
    mean.add(Model(params={"n": np.array([3, 4]), "h": np.full(2, 5, np.float16)}, num_examples=1))
    result = mean.result()
    assert result["n"].dtype == np.int64 and result["n"].tolist() == [2, 3]
    assert result["h"].dtype == np.float16 and result["h"].tolist() == [4.0, 4.0]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            arrays(np.float64, (2, 3), elements=finite),
            st.integers(1, 1000),
            st.sampled_from(["full", "diff"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
    arrays(np.float64, (2, 3), elements=finite),
)
def test_reuse_gives_the_exact_mean_of_every_result_it_accepts(results, reference):
    mean = WeightedMean({"w": reference.copy()}, reuse_reference=True)
    accepted = []
    for params, n, kind, streamed in results:
        model = Model(params={"w": params.copy()}, num_examples=n, params_type=kind)
        try:
            if streamed:
                mean.add_stream(open_model(encode(model, chunk_size=5)), block_bytes=16)
            else:
                mean.add(model)
        except ResultRejected:
            # only a diff after the global model was given to a full result is refused
            assert kind == "diff" and mean.reference_consumed
            continue
        accepted.append((params, n, kind))
    got = mean.result()["w"]
    total = sum(n for _, n, _ in accepted)
    expected = sum(n * (p + reference if k == "diff" else p) for p, n, k in accepted) / total
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def _site(value: float, n: int = 1):
    """A site answering train tasks with full weights ``value``."""

    def handler(topic: str, model: Model) -> Model:
        return Model(params={"w": np.full(4, value, np.float32)}, num_examples=n)

    return handler


def test_the_workflow_takes_the_initial_model_over_and_averages_in_its_buffer(tmp_path):
    initial = Model(params={"w": np.zeros(4, np.float32)})
    address = _buffer(initial.params["w"])
    runs = []

    def workflow(channel, args, init, job_args):
        from atoll.fl.workflows.fedavg import FedAvgRun

        run = FedAvgRun(channel, args, init, job_args, "fedavg", None, {})
        runs.append(run)
        run.run()

    args = FedAvgArgs(num_rounds=3, evaluate_every=0, cross_site_eval="none")
    run_workflow(workflow, args, {"a": _site(1.0), "b": _site(4.0, n=3)}, tmp_path, initial)
    assert initial.params == {}  # the workflow owns the arrays now
    final = runs[0].global_params["w"]
    np.testing.assert_allclose(final, np.full(4, 3.25))
    assert _buffer(final) == address  # every round's average landed in the same buffer
    saved = load_file(tmp_path / "global_model_final.safetensors").params["w"]
    np.testing.assert_allclose(saved, np.full(4, 3.25))


def test_a_diff_in_a_reused_round_misses_that_round_only(tmp_path):
    """site-a's full weights arrive first and take the global model's buffer; site-b's diff in
    that round is rejected with the reason, and from then on the global model is kept aside."""
    federation = Federation(["site-a", "site-b"], tmp_path)
    a_replied = threading.Event()

    def site(name: str, value: float, params_type: str) -> None:
        channel = federation.site_channel(name)
        while (task := channel.receive()) is not None:
            decode(task.chunks)
            if name == "site-b" and not a_replied.is_set():  # round 0: after site-a's reply
                assert a_replied.wait(timeout=60)
            answer = Model(
                params={"w": np.full(4, value, np.float32)}, num_examples=1, params_type=params_type
            )
            channel.reply(task.task_id, {}, encode(answer))
            if name == "site-a":
                a_replied.set()

    threads = [
        threading.Thread(target=site, args=("site-a", 2.0, "full"), daemon=True),
        threading.Thread(target=site, args=("site-b", 1.0, "diff"), daemon=True),
    ]
    for thread in threads:
        thread.start()
    args = FedAvgArgs(num_rounds=2, min_clients=1, evaluate_every=0, cross_site_eval="none")
    try:
        run_fedavg(
            federation.server_channel(), args, Model(params={"w": np.zeros(4, np.float32)}), {}
        )
    finally:
        federation.close()
        for thread in threads:
            thread.join(timeout=30)
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert "send the same params_type" in rounds[0]["failed"]["site-b"]
    assert rounds[1]["failed"] == {}
    final = load_file(tmp_path / "global_model_final.safetensors").params["w"]
    np.testing.assert_allclose(final, np.full(4, (2.0 + (2.0 + 1.0)) / 2))  # round 0 gave 2.0


def test_fedopt_keeps_the_global_model_for_its_optimizer(tmp_path):
    x0 = np.array([1.0, 2.0, -3.0])
    initial = Model(params={"w": x0.copy()})

    def site(topic, model):
        return Model(params={"w": model.params["w"] + 1.0}, num_examples=1)

    args = FedOptArgs(num_rounds=1, evaluate_every=0, cross_site_eval="none", server_lr=1.0)
    run_workflow(run_fedopt, args, {"a": site, "b": site}, tmp_path, initial)
    final = load_file(tmp_path / "global_model_final.safetensors").params["w"]
    # one Adam step from x0 towards x0 + 1: m = 0.1, v = 0.99 tau^2 + 0.01 -> x0 + m / (sqrt(v) + tau)
    v = 0.99 * 1e-6 + 0.01
    np.testing.assert_allclose(final, x0 + 0.1 / (np.sqrt(v) + 1e-3), rtol=1e-9)


def test_results_of_equal_weight_are_added_as_they_are_without_a_scratch_buffer():
    # The sum is kept in units of the first result's weight: a second result of the same weight
    # is added straight from its blocks (one pass), so no block is scaled into a scratch buffer.
    size = 8 * 1024 * 1024  # 32 MiB of float32
    blobs = [
        [bytes(c) for c in encode(Model(params={"w": np.full(size, v, np.float32)},
                                        num_examples=5))]
        for v in (1.0, 4.0, 7.0)
    ]
    mean = WeightedMean({"w": np.zeros(size, np.float32)}, reuse_reference=True)
    tracemalloc.start()
    for blob in blobs:
        mean.add_stream(open_model(iter(blob)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1024 * 1024  # a 4 MiB scratch block would show here
    np.testing.assert_array_equal(mean.result()["w"][:3], [4.0, 4.0, 4.0])


def test_unequal_weights_and_integers_average_exactly_on_both_paths():
    reference = {"w": np.zeros(3, np.float32), "n": np.zeros((), np.int64)}
    for streamed in (False, True):
        mean = WeightedMean({k: v.copy() for k, v in reference.items()}, reuse_reference=True)
        for value, n in ((1.0, 2), (4.0, 2), (10.0, 6)):
            model = Model(params={"w": np.full(3, value, np.float32),
                                  "n": np.array(int(value), np.int64)}, num_examples=n)
            if streamed:
                mean.add_stream(open_model(encode(model, chunk_size=4)), block_bytes=8)
            else:
                mean.add(model)
        got = mean.result()
        np.testing.assert_allclose(got["w"], [7.0, 7.0, 7.0])  # (2 + 8 + 60) / 10
        assert got["n"].dtype == np.int64 and int(got["n"]) == 7


def test_the_mean_lists_its_tensors_in_the_global_models_order():
    # The reused buffers come first in the sum; the result must not reorder the model that
    # goes out next round (its header, and the sites' decode into last round's arrays).
    names = [f"layer{i}" for i in (3, 0, 9, 1, 7, 2, 8, 4, 6, 5)]
    reference = {name: np.zeros(4, np.float32) for name in names}
    reference["layer1"] = np.zeros(4, np.float16)  # not reusable: summed in its own buffer
    for streamed in (False, True):
        mean = WeightedMean({k: v.copy() for k, v in reference.items()}, reuse_reference=True)
        model = Model(params={k: np.ones_like(v) for k, v in reversed(reference.items())},
                      num_examples=1)
        if streamed:
            mean.add_stream(open_model(encode(model)))
        else:
            mean.add(model)
        assert list(mean.result()) == names
