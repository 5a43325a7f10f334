"""bf16 in, bf16 out: half-precision models travel and are stored in their own dtype, and
FedAvg of them is the float32 mean rounded once (torch is the reference for the rounding)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from atoll.fl import bfloat16
from atoll.fl.aggregation import WeightedMean
from atoll.fl.aggregators import CoordinateMedian
from atoll.fl.bfloat16 import BF16
from atoll.fl.model import Model
from atoll.fl.serde import SerdeError, decode, encode, load_file, open_model, save_file
from atoll.fl.torch_bridge import to_params, to_state_dict


def _bf16(values: np.ndarray) -> np.ndarray:
    """torch's own rounding of float32 values to bfloat16, as atoll's tagged words."""
    return to_params({"x": torch.from_numpy(np.asarray(values, np.float32)).bfloat16()})["x"]


def _torch_words(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.asarray(values, np.float32)).bfloat16().view(torch.int16).numpy()


def _header(payload: bytes) -> dict:
    (n,) = struct.unpack("<Q", payload[:8])
    return json.loads(payload[8 : 8 + n])


def test_rounding_matches_torch_bit_for_bit():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(3_000_000) * 1e3).astype(np.float32)  # several of from_float32's blocks
    ties = [0x3F808000, 0x3F818000, 0x3F80C000, 0x3F817FFF, 0x7F7FFFFF, 0x00018000, 0x00008000]
    x[:7] = np.array(ties, np.uint32).view(np.float32)  # halfway cases both ways, overflow, subnormal
    x[7:12] = [np.inf, -np.inf, 0.0, -0.0, 1e-40]
    mine = bfloat16.words(bfloat16.from_float32(x))
    np.testing.assert_array_equal(mine.view(np.int16), _torch_words(x))
    # widening is exact: bf16 -> float32 -> bf16 is the identity
    wide = bfloat16.to_float32(bfloat16.from_float32(x))
    np.testing.assert_array_equal(wide, torch.from_numpy(x).bfloat16().float().numpy())
    nan = bfloat16.from_float32(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(bfloat16.to_float32(nan)).all()


def test_arithmetic_on_raw_words_is_refused():
    with pytest.raises(TypeError):
        _bf16(np.ones(3)) + 1  # noqa: B018 - numpy refuses: widen first


def test_a_bf16_model_travels_and_is_stored_as_bf16(tmp_path):
    values = np.linspace(-3, 3, 1000, dtype=np.float32).reshape(10, 100)
    model = Model(params={"w": _bf16(values), "f": values.astype(np.float16)}, num_examples=1)
    payload = b"".join(bytes(c) for c in encode(model))
    header = _header(payload)
    assert header["w"]["dtype"] == "BF16" and header["f"]["dtype"] == "F16"
    assert len(payload) - 8 - len(_header_bytes(payload)) == 1000 * 2 * 2  # 2 bytes an element
    back = decode([payload])
    assert back.params["w"].dtype == BF16
    np.testing.assert_array_equal(bfloat16.words(back.params["w"]), bfloat16.words(_bf16(values)))
    path = save_file(back, tmp_path / "m.safetensors")
    stored = load_file(path)
    assert stored.params["w"].dtype == BF16
    # and the tensor torch gets is the same bf16 tensor
    assert torch.equal(to_state_dict(stored.params)["w"], torch.from_numpy(values).bfloat16())


def _header_bytes(payload: bytes) -> bytes:
    (n,) = struct.unpack("<Q", payload[:8])
    return payload[8 : 8 + n]


def test_another_two_byte_structured_dtype_is_not_taken_for_bf16():
    other = np.zeros(3, dtype=[("x", "<i2")])
    with pytest.raises(SerdeError, match="cannot be serialized"):
        list(encode(Model(params={"x": other})))


@pytest.mark.parametrize("streamed", [True, False])
def test_fedavg_of_bf16_results_is_the_float32_mean_rounded_once(streamed):
    rng = np.random.default_rng(1)
    shape = (300, 1000)  # 600 kB a result: several blocks, elements cut across chunks
    weights = [3, 5, 11]
    sites = [_bf16(rng.standard_normal(shape).astype(np.float32)) for _ in weights]
    reference = _bf16(np.zeros(shape, np.float32))
    mean = WeightedMean({"w": reference})
    for words, n in zip(sites, weights, strict=True):
        model = Model(params={"w": words.copy()}, num_examples=n)
        if streamed:
            mean.add_stream(open_model(encode(model, chunk_size=4099)), block_bytes=65_537)
        else:
            mean.add(model)
    out = mean.result()["w"]
    assert out.dtype == BF16
    # the reference: float32 sums of the exact widened values, in the same order, rounded once
    total = np.zeros(shape, np.float32)
    for words, n in zip(sites, weights, strict=True):
        total += bfloat16.to_float32(words) * np.float32(n / weights[0])
    total *= np.float32(weights[0] / sum(weights))
    np.testing.assert_array_equal(bfloat16.words(out).view(np.int16), _torch_words(total))
    # and close to the float64 mean: one bf16 rounding (2^-8 relative), float32 sums beside it
    exact = sum(bfloat16.to_float32(w).astype(np.float64) * n
                for w, n in zip(sites, weights, strict=True)) / sum(weights)
    np.testing.assert_allclose(bfloat16.to_float32(out), exact, rtol=2**-8, atol=1e-6)


def test_fedavg_of_bf16_diffs_applies_them_to_the_bf16_global_model():
    base = _bf16(np.full((4, 4), 1.5, np.float32))
    mean = WeightedMean({"w": base})
    for delta in (0.25, 0.75):
        mean.add(Model(params={"w": _bf16(np.full((4, 4), delta))}, params_type="diff",
                       num_examples=1))
    out = mean.result()["w"]
    assert out.dtype == BF16
    np.testing.assert_array_equal(bfloat16.to_float32(out), np.full((4, 4), 2.0, np.float32))


def test_robust_aggregators_keep_bf16():
    median = CoordinateMedian()
    for v in (1.0, 2.0, 9.0):
        median.add("s", Model(params={"w": _bf16(np.full(3, v))}, num_examples=1))
    out = median.result()["w"]
    assert out.dtype == BF16
    np.testing.assert_array_equal(bfloat16.to_float32(out), np.full(3, 2.0, np.float32))


def test_fedopt_updates_bf16_weights_in_float32_and_keeps_them_bf16():
    from atoll.fl.workflows.fedopt import ServerOptimizer

    x32 = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
    target32 = x32 + np.float32(0.25)
    half, full = (ServerOptimizer("adam", 0.1, 0.9, 0.99, 1e-3) for _ in range(2))
    out = half({"w": _bf16(x32)}, {"w": _bf16(target32)})["w"]
    assert out.dtype == BF16
    # the float32 step from the same (exactly representable) inputs, rounded once
    expected = full({"w": x32}, {"w": target32})["w"]
    np.testing.assert_array_equal(bfloat16.words(out).view(np.int16), _torch_words(expected))
    assert not np.array_equal(bfloat16.to_float32(out), x32)  # bf16 weights did move


def test_privacy_works_on_bf16_models_in_float32():
    """A site's update under privacy filters is taken in float32 (clip and noise are calibrated
    there), and the server applies the mean update to the bf16 global model rounding once."""
    from atoll.fl.privacy import filters
    from atoll.fl.privacy.server_privacy import apply_update
    from atoll.fl.privacy.site_privacy import _difference
    from atoll.spec.privacy import ClipFilter

    received = _bf16(np.array([1.0, 2.0, 3.0], np.float32))
    trained = _bf16(np.array([1.5, 2.0, -1.0], np.float32))
    update = _difference(trained, received.copy())
    assert update.dtype == np.float32
    np.testing.assert_array_equal(update, [0.5, 0.0, -4.0])
    clipped = filters.apply([ClipFilter(type="clip", max_norm=1.0)], {"w": update})["w"]
    assert abs(float(np.linalg.norm(clipped)) - 1.0) < 1e-6  # bf16 is no longer skipped
    out = apply_update({"w": received}, {"w": clipped.copy()})["w"]
    assert out.dtype == BF16
    expected = bfloat16.to_float32(received) + clipped
    np.testing.assert_array_equal(bfloat16.words(out).view(np.int16), _torch_words(expected))


@pytest.mark.parametrize("accumulator", ["memory", "disk"])
def test_a_fedavg_job_keeps_a_bf16_model_bf16_from_task_to_results(tmp_path, accumulator,
                                                                    monkeypatch):
    from atoll.fl.app_config import FedAvgArgs
    from atoll.fl.workflows import run_fedavg

    from .helpers import run_workflow

    monkeypatch.chdir(tmp_path)  # the disk accumulator's folder: the worker's run folder
    start = np.linspace(-1, 1, 64 * 1024, dtype=np.float32)
    seen: list[np.dtype] = []

    def site(step):
        def handler(topic, model):
            seen.append(model.params["w"].dtype)  # what the site received
            wide = bfloat16.to_float32(model.params["w"]) + np.float32(step)
            return Model(params={"w": bfloat16.from_float32(wide)}, num_examples=1)

        return handler

    results = tmp_path / "results"
    args = FedAvgArgs(num_rounds=2, evaluate_every=0, cross_site_eval="none",
                      accumulator=accumulator)
    run_workflow(run_fedavg, args, {"a": site(0.25), "b": site(0.75)}, results,
                 initial=Model(params={"w": _bf16(start)}))
    assert seen == [BF16] * 4
    final = results / "global_model_final.safetensors"
    raw = final.read_bytes()
    assert _header(raw)["w"]["dtype"] == "BF16"
    out = load_file(final).params["w"]
    # each round: the float32 mean of the two bf16 results, rounded once
    expected = _bf16(start)
    for _ in range(2):
        wide = bfloat16.to_float32(expected)
        a = bfloat16.to_float32(_bf16(wide + np.float32(0.25)))
        b = bfloat16.to_float32(_bf16(wide + np.float32(0.75)))
        expected = _bf16((a + b) * np.float32(0.5))
    np.testing.assert_array_equal(bfloat16.words(out), bfloat16.words(expected))
