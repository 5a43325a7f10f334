"""8-bit quantized exchange (atoll.fl.quantization through atoll.fl.serde): the error bound per
block, the bytes on the wire, what passes unchanged, and the refusal of malformed payloads."""

from __future__ import annotations

import json
import math
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from atoll.fl import bfloat16, quantization
from atoll.fl.aggregation import WeightedMean
from atoll.fl.model import Model
from atoll.fl.serde import SerdeError, decode, encode, open_model

Q8 = SimpleNamespace(block_size=256, min_elements=1024)


def _bytes(model: Model, quantize=Q8, chunk_size: int = 1 << 22) -> bytes:
    return b"".join(bytes(c) for c in encode(model, chunk_size, quantize=quantize))


def _header(blob: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def _document(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _values(dtype_name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # blocks of very different ranges: a large one, a small one, a constant one
    x = rng.normal(0, 1, shape) * np.where(np.arange(math.prod(shape)).reshape(shape) < 512,
                                           100.0, 0.01)
    x.reshape(-1)[1024:1280] = 3.25
    if dtype_name == "BF16":
        return bfloat16.from_float32(x.astype(np.float32))
    return x.astype(dtype_name)


def _as_float64(array: np.ndarray) -> np.ndarray:
    return bfloat16.widen(array, np.dtype(np.float64))


def _bound(x: np.ndarray) -> np.ndarray:
    """Half of each value's block step, plus the float32 rounding of lo + code x step (two
    roundings, each at most half a unit at the block's largest magnitude)."""
    table = quantization.scales(x, Q8.block_size).astype(np.float64)
    lo, step = (np.repeat(table[:, i], Q8.block_size)[: x.size].reshape(x.shape) for i in (0, 1))
    return step / 2 + np.spacing((np.abs(lo) + 255 * step).astype(np.float32)).astype(np.float64)


def _half_ulp(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """Half a unit in the last place of ``dtype_name`` at each value (0 for the wide dtypes,
    whose own rounding is below the bound's float slack)."""
    if dtype_name == "float16":
        return np.spacing(np.abs(values).astype(np.float16)).astype(np.float64) / 2
    if dtype_name == "BF16":  # bf16 keeps 8 of float32's 24 significand bits
        return np.spacing(np.abs(values).astype(np.float32)).astype(np.float64) * 2.0**15
    return np.zeros_like(values)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "BF16", "float64"])
def test_each_value_comes_back_within_half_its_blocks_step(dtype_name):
    x = _values(dtype_name, (40, 100))
    back = decode([_bytes(Model(params={"w": x}))]).params["w"]
    assert back.dtype == x.dtype and back.shape == x.shape  # the tensor's own dtype
    table = quantization.scales(x, Q8.block_size)
    step = np.repeat(table[:, 1].astype(np.float64), Q8.block_size)[: x.size].reshape(x.shape)
    want, got = _as_float64(x), _as_float64(back)
    assert (np.abs(got - want) <= _bound(x) + _half_ulp(want, dtype_name)).all()
    assert (step > 0).any() and (step == 0).any()  # the constant block came back exactly
    constant = x.reshape(-1)[1024:1280]
    np.testing.assert_array_equal(back.reshape(-1)[1024:1280], constant)
    # and it is a real 8-bit grid: the large block's error is far above float32 rounding
    assert np.abs(got - want).max() > 1e-3


def test_a_float32_model_travels_in_a_quarter_of_its_bytes():
    n = 1 << 20
    x = np.random.default_rng(1).normal(0, 1, n).astype(np.float32)
    plain = b"".join(bytes(c) for c in encode(Model(params={"w": x})))
    quantized = _bytes(Model(params={"w": x}))
    header, data = _header(quantized)
    blocks = n // Q8.block_size
    assert len(data) == n + blocks * 8  # one byte per value, a float32 lo and step per block
    assert header["w"]["dtype"] == "U8" and header["w#q8"]["shape"] == [blocks, 2]
    assert len(quantized) <= 0.26 * len(plain)


def test_a_bf16_model_travels_in_half_its_bytes():
    x = bfloat16.from_float32(np.random.default_rng(2).normal(0, 1, 1 << 18).astype(np.float32))
    plain = b"".join(bytes(c) for c in encode(Model(params={"w": x})))
    quantized = _bytes(Model(params={"w": x}))
    assert len(quantized) <= 0.52 * len(plain)
    assert json.loads(_header(quantized)[0]["__metadata__"]["quantized"])["tensors"] == {
        "w": "BF16"}


def test_integers_tiny_and_non_finite_tensors_pass_unchanged():
    rng = np.random.default_rng(3)
    nan = rng.normal(0, 1, 2048).astype(np.float32)
    nan[5] = np.nan
    params = {"steps": np.arange(4096, dtype=np.int64), "mask": rng.random(4096) > 0.5,
              "bias": rng.normal(0, 1, 100).astype(np.float32), "nan": nan,
              "w": rng.normal(0, 1, 4096).astype(np.float32)}
    blob = _bytes(Model(params=params))
    header, _ = _header(blob)
    assert {k: header[k]["dtype"] for k in params} == {
        "steps": "I64", "mask": "BOOL", "bias": "F32", "nan": "F32", "w": "U8"}
    back = decode([blob]).params
    assert list(back) == list(params)  # the sender's order
    for name in ("steps", "mask", "bias", "nan"):
        np.testing.assert_array_equal(back[name], params[name])


def test_a_model_with_nothing_to_quantize_is_a_plain_document():
    model = Model(params={"b": np.ones(8, np.float32)}, round=3)
    assert _bytes(model) == b"".join(bytes(c) for c in encode(model))


def test_the_aggregator_folds_decoded_values_never_codes():
    """A streamed FedAvg over quantized results equals the mean of the decoded results."""
    rng = np.random.default_rng(4)
    shape = (64, 300)
    results = [rng.normal(0, 1, shape).astype(np.float32) for _ in range(3)]
    blobs = [_bytes(Model(params={"w": r, "b": np.ones(3, np.float32)}, num_examples=n + 1))
             for n, r in enumerate(results)]
    mean = WeightedMean()
    for blob in blobs:  # in chunks that cut tables and codes anywhere
        stream = open_model([blob[i : i + 999] for i in range(0, len(blob), 999)])
        assert dict((n, d) for n, d, _ in stream.entries) == {"w": np.float32, "b": np.float32}
        mean.add_stream(stream, block_bytes=4000)
    decoded = [decode([b]).params["w"].astype(np.float64) for b in blobs]
    want = sum((n + 1) * d for n, d in enumerate(decoded)) / 6
    got = mean.result()["w"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(got - sum((n + 1) * r for n, r in enumerate(results)) / 6).max() < 0.02


def test_a_tensor_larger_than_one_decoding_pass_reads_and_streams_the_same():
    """read() (into a spare array of the last model) and blocks() decode the same values, across
    the passes of a tensor larger than one (serde.DECODED_VALUES)."""
    from atoll.fl.serde import DECODED_VALUES, ModelStream

    x = np.random.default_rng(7).normal(0, 1, DECODED_VALUES + 1000).astype(np.float32)
    blob = _bytes(Model(params={"w": x}))
    spare = {"w": np.empty_like(x)}
    address = spare["w"].ctypes.data  # (a name for the array itself would keep it in use)
    read = ModelStream([blob]).read(spare=spare).params["w"]
    assert read.ctypes.data == address  # decoded into the spare array, no new allocation
    streamed = np.empty_like(x)
    for name, start, block in open_model([blob]).blocks(block_bytes=3 * 4096 + 4):
        assert name == "w" and block.dtype == np.float32
        streamed[start : start + len(block)] = block
    np.testing.assert_array_equal(read, streamed)
    assert (np.abs(read.astype(np.float64) - x) <= _bound(x)).all()


# --- a malformed payload is refused where it lands ------------------------------------------


def _valid() -> bytes:
    x = np.random.default_rng(5).normal(0, 1, (8, 256)).astype(np.float32)
    return _bytes(Model(params={"w": x, "n": np.arange(3)}))


def _with(header_change=None, table=None) -> bytes:
    header, data = _header(_valid())
    if header_change is not None:
        header_change(header)
    if table is not None:  # overwrite the first table row's (lo, step)
        data = np.array(table, np.float32).tobytes() + data[8:]
    return _document(header, data)


def _metadata(**change):
    def edit(header):
        info = json.loads(header["__metadata__"]["quantized"])
        info.update(change)
        header["__metadata__"]["quantized"] = json.dumps(info)
    return edit


def _retype(dtype, shape=None):
    def edit(header):
        header["w"]["dtype"] = dtype
        if shape is not None:
            header["w#q8"]["shape"] = shape
    return edit


def _rename(header):
    header["n#q8"] = header.pop("n")


@pytest.mark.parametrize(("payload", "reason"), [
    (lambda: _with(table=[0.0, np.nan]), "lo or step is not finite"),
    (lambda: _with(table=[np.inf, 1.0]), "lo or step is not finite"),
    (lambda: _with(table=[0.0, -1.0]), "step is negative"),
    (lambda: _with(table=[3e38, 1e37]), "range leaves float32"),
    (lambda: _with(_metadata(block_size=4)), "block_size must be an int in 16"),
    (lambda: _with(_metadata(block_size=1 << 30)), "block_size must be an int in 16"),
    (lambda: _with(_metadata(scheme="q4")), "scheme 'q4' is not supported"),
    (lambda: _with(_metadata(tensors={"w": "I64"})), "must name each quantized tensor's dtype"),
    (lambda: _with(_metadata(tensors={"v": "F32"})), "'v': its codes must be a U8 tensor"),
    (lambda: _with(_metadata(block_size=128)), "needs an F32 [16, 2] tensor 'w#q8'"),
    (lambda: _with(_retype("I8")), "its codes must be a U8 tensor"),
    (lambda: _with(_metadata(extra=1)), "exactly scheme, block_size and tensors"),
    (lambda: _with(_rename), "'n#q8' is named as a quantization table"),
])
def test_a_malformed_quantized_payload_is_refused_with_its_reason(payload, reason):
    with pytest.raises(SerdeError, match="quantized payload refused") as refused:
        open_model([payload()])
    assert reason in str(refused.value)


def test_tables_larger_than_the_bound_are_refused_before_they_are_allocated():
    """A header may claim any shape; the tables are read whole, so their size is bounded."""
    n = 1 << 40  # a claimed tensor of a trillion values: its tables alone would be 32 GiB
    tables = n // 256 * 8
    header = {"__metadata__": {"quantized": json.dumps(
                  {"scheme": "q8", "block_size": 256, "tensors": {"w": "F32"}})},
              "w#q8": {"dtype": "F32", "shape": [n // 256, 2], "data_offsets": [0, tables]},
              "w": {"dtype": "U8", "shape": [n], "data_offsets": [tables, tables + n]}}
    with pytest.raises(SerdeError, match=r"the lo/step tables take 34359738368 bytes, more than"):
        open_model([_document(header, b"")])


def test_the_tables_must_come_before_every_code():
    x = np.random.default_rng(6).normal(0, 1, 2048).astype(np.float32)
    header, data = _header(_bytes(Model(params={"w": x})))
    table_bytes = header["w#q8"]["data_offsets"][1]
    # the same tensors, the codes first: the receiver would have to use codes it cannot check
    header["w"]["data_offsets"] = [0, 2048]
    header["w#q8"]["data_offsets"] = [2048, 2048 + table_bytes]
    swapped = data[table_bytes:] + data[:table_bytes]
    with pytest.raises(SerdeError, match="tables must come first in data order"):
        open_model([_document(header, swapped)])


def test_a_refused_payload_is_refused_before_any_code_is_read():
    """The check runs while the header and tables are read: nothing of the codes is needed."""
    blob = _with(table=[0.0, np.nan])
    header, _ = _header(blob)
    up_to_tables = 8 + len(json.dumps(header).encode()) + header["w#q8"]["data_offsets"][1]
    with pytest.raises(SerdeError, match="not finite"):
        open_model([blob[:up_to_tables]])


def test_reserved_names_cannot_be_sent_quantized():
    with pytest.raises(ValueError, match="reserved for quantized exchange"):
        _bytes(Model(params={"w#q8": np.ones(4096, np.float32)}))
