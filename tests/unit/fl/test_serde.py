"""Models as safetensors streams: round trips, strict header validation, zero-copy chunking."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atoll.fl.model import Model
from atoll.fl.serde import CHUNK_SIZE, DTYPES, SerdeError, decode, encode, load_file, save_file


def _bytes(model: Model, chunk_size: int = CHUNK_SIZE) -> bytes:
    return b"".join(bytes(c) for c in encode(model, chunk_size))


def _document(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_every_dtype_round_trips(name):
    dtype = DTYPES[name]
    rng = np.random.default_rng(1)
    values = rng.integers(0, 2, size=(3, 5)) if dtype.kind == "b" else rng.normal(0, 50, (3, 5))
    params = {
        "matrix": values.astype(dtype),
        "scalar": np.array(values.flat[0], dtype=dtype),
        "empty": np.zeros((0, 4), dtype=dtype),
    }
    back = decode(encode(Model(params=params)))
    assert list(back.params) == list(params)
    for key, array in params.items():
        assert back.params[key].dtype == array.dtype
        assert back.params[key].shape == array.shape
        np.testing.assert_array_equal(back.params[key], array)


def test_metadata_round_trips():
    model = Model(
        params={"w": np.arange(4.0)},
        params_type="diff",
        num_examples=42,
        metrics={"accuracy": 0.75, "loss": 1.5},
        round=3,
        meta={"total_rounds": 10, "note": "ünïcode", "nested": {"a": [1, 2]}},
    )
    back = decode(encode(model))
    assert (back.params_type, back.num_examples, back.metrics, back.round, back.meta) == (
        "diff",
        42,
        {"accuracy": 0.75, "loss": 1.5},
        3,
        model.meta,
    )
    assert back.total_rounds == 10


def test_non_contiguous_and_big_endian_arrays_are_written_little_endian_contiguous():
    base = np.arange(24, dtype=">f4").reshape(4, 6)
    params = {"strided": base[:, ::2], "transposed": base.T}
    back = decode(encode(Model(params=params)))
    np.testing.assert_array_equal(back.params["strided"], base[:, ::2])
    np.testing.assert_array_equal(back.params["transposed"], base.T)
    assert back.params["strided"].dtype == np.dtype("<f4")


def test_the_file_is_plain_safetensors():
    """Read back with nothing but struct and json, as any safetensors reader would."""
    params = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], np.int64)}
    blob = _bytes(Model(params=params, round=2))
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0  # the data section is 8-byte aligned
    header = json.loads(blob[8 : 8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}
    assert all(isinstance(v, str) for v in header["__metadata__"].values())
    data = blob[8 + n :]
    np.testing.assert_array_equal(np.frombuffer(data[:24], "<f4").reshape(2, 3), params["a"])


def test_a_large_model_streams_as_views_of_its_own_buffers():
    big = np.arange(10 * 1024 * 1024 // 4, dtype=np.float32)  # 10 MiB
    small = {f"bias{i}": np.full(3, i, np.float32) for i in range(50)}
    model = Model(params={**small, "big": big})
    chunk_size = 1024 * 1024
    chunks = list(encode(model, chunk_size))
    header, small_part, big_parts = chunks[0], chunks[1], chunks[2:]
    assert len(small_part) == 50 * 12  # the tiny arrays travel together, not as 50 messages
    assert len(big_parts) == 10 and all(len(c) == chunk_size for c in big_parts)
    for chunk in big_parts:  # no copy: every chunk is a window on the array itself
        assert np.shares_memory(np.frombuffer(chunk, np.uint8), big)
    assert max(len(c) for c in chunks) <= chunk_size
    back = decode(iter(chunks))
    np.testing.assert_array_equal(back.params["big"], big)
    assert len(header) == 8 + struct.unpack("<Q", bytes(header[:8]))[0]


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30))
def test_decode_accepts_any_chunking(cuts):
    params = {"x": np.arange(100, dtype=np.float64), "y": np.arange(7, dtype=np.int16)}
    blob = _bytes(Model(params=params, metrics={"m": 1.0}))
    points = sorted({min(c, len(blob)) for c in cuts} | {0, len(blob)})
    pieces = [blob[a:b] for a, b in zip(points, points[1:], strict=False)]
    back = decode(iter(pieces))
    np.testing.assert_array_equal(back.params["x"], params["x"])
    np.testing.assert_array_equal(back.params["y"], params["y"])


def test_save_and_load_file(tmp_path):
    model = Model(params={"w": np.ones((3, 3), np.float16)}, round=1)
    path = save_file(model, tmp_path / "m.safetensors")
    back = load_file(path)
    np.testing.assert_array_equal(back.params["w"], model.params["w"])
    assert not (tmp_path / "m.safetensors.part").exists()


def test_unsupported_dtypes_are_refused_when_encoding():
    with pytest.raises(SerdeError, match="complex128 cannot be serialized"):
        list(encode(Model(params={"c": np.zeros(2, np.complex128)})))


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x01\x02", "payload ended early: the header length"),
        (struct.pack("<Q", 10**12), "header length 1000000000000 is out of bounds"),
        (struct.pack("<Q", 4) + b"nope", "header is not valid JSON"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "header is not UTF-8"),
        (_document([1, 2]), "header must be a JSON object"),
        (_document({"t": {**F32, "dtype": "C64"}}, bytes(8)), "dtype 'C64' is not supported"),
        (
            _document({"t": {**F32, "shape": [-2]}}, bytes(8)),
            "shape must be a list of non-negative",
        ),
        (
            _document({"t": {**F32, "shape": [True]}}, bytes(8)),
            "shape must be a list of non-negative",
        ),
        (_document({"t": {**F32, "data_offsets": [4, 0]}}), "data_offsets must be"),
        (_document({"t": {**F32, "shape": [3]}}, bytes(8)), "needs 12"),
        (
            _document({"t": {**F32, "data_offsets": [8, 16]}}, bytes(16)),
            "starts at byte 8, expected 0",
        ),
        (
            _document({"a": F32, "b": {**F32, "data_offsets": [4, 12]}}, bytes(12)),
            "starts at byte 4, expected 8",
        ),
        (
            _document({"t": {"dtype": "F32", "shape": [2**62], "data_offsets": [0, 2**64]}}),
            "cannot be allocated",
        ),
        (_document({"t": {**F32, "extra": 1}}, bytes(8)), "exactly dtype, shape and data_offsets"),
        (_document({"t": F32}, bytes(4)), "payload ended early: tensor 't' needs 8 bytes, got 4"),
        (_document({"t": F32}, bytes(9)), "continues past the last tensor"),
        (_document({"__metadata__": {"a": 1}}), "__metadata__ must be an object of string"),
        (_document({"__metadata__": {"params_type": "half"}}), "params_type must be full or diff"),
        (
            _document({"__metadata__": {"num_examples": "-1"}}),
            "num_examples must be a non-negative",
        ),
        (_document({"__metadata__": {"metrics": '{"a": "x"}'}}), "metrics must be an object"),
        (_document({"__metadata__": {"round": "1.5"}}), "round must be an int or null"),
        (_document({"__metadata__": {"meta": "{"}}), "meta is not valid JSON"),
    ],
)
def test_malformed_documents_are_refused_with_the_reason(blob, message):
    with pytest.raises(SerdeError, match=message.replace("(", r"\(").replace("[", r"\[")):
        decode(iter([blob]))


def test_duplicate_tensor_names_are_refused():
    raw = b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    with pytest.raises(SerdeError, match="duplicate key 't'"):
        decode(iter([struct.pack("<Q", len(raw)) + raw + b"\x00"]))


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=300))
def test_random_bytes_fail_only_with_serde_error(blob):
    try:
        decode(iter([blob]))
    except SerdeError:
        pass


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_corrupted_documents_fail_only_with_serde_error(data):
    blob = bytearray(
        _bytes(
            Model(
                params={"a": np.arange(5, dtype=np.int32), "b": np.ones(2)},
                metrics={"x": 1.0},
                round=1,
            )
        )
    )
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(blob) - 1))
        blob[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    try:
        model = decode(iter([bytes(blob[:cut])]))
    except SerdeError:
        return
    assert isinstance(model, Model)  # a corruption inside array data is still a valid document
