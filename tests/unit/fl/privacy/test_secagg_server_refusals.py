"""The server side of secure aggregation refuses what would break its promise, at the entry point
that folds each reply (``SecureRound.add_masked``): a result that is not masked (it would be one
site's update in the clear in the server's memory), and a masked result whose names or shapes
differ from the others' (it would corrupt the sum, or fold into the wrong entries). A refused
reply leaves the running sum as it was."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.aggregation import ResultRejected
from atoll.fl.model import Model
from atoll.fl.privacy.secagg import masking
from atoll.fl.privacy.secagg.server import SecureRound
from atoll.fl.serde import encode, open_model


def _round() -> SecureRound:
    # add_masked never talks to the sites: no channel is needed to fold replies
    return SecureRound(channel=None, round_=1, headers={}, timeout=None, min_clients=2)


def _reply(params: dict[str, np.ndarray]):
    return open_model(encode(Model(params=params, num_examples=1)))


def _masked(**shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out = {name: rng.integers(0, 2**63, size=shape, dtype=np.uint64)
           for name, shape in shapes.items()}
    out[masking.WEIGHT] = np.array([3], np.uint64)
    return out


def test_a_plain_float_result_is_refused_as_unmasked():
    secure = _round()
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("a", _reply({"w": np.ones(4, np.float32)}))
    assert secure._sum == {} and secure._masked == []


def test_a_uint64_result_without_the_weight_entry_is_refused_as_unmasked():
    secure = _round()
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("a", _reply({"w": np.ones(4, np.uint64)}))
    assert secure._sum == {} and secure._masked == []


def test_a_masked_result_of_another_shape_is_refused_and_the_sum_kept():
    secure = _round()
    first = _masked(w=(4,))
    secure.add_masked("a", _reply(first))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(w=(5,))))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(w=(2, 2))))
    assert secure._masked == ["a"]
    assert np.array_equal(secure._sum["w"], first["w"])


def test_a_masked_result_with_other_names_is_refused():
    secure = _round()
    secure.add_masked("a", _reply(_masked(w=(4,))))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(w=(4,), extra=(1,))))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(v=(4,))))
    assert secure._masked == ["a"]


def test_matching_masked_results_fold_modulo_two_to_the_64():
    secure = _round()
    first, second = _masked(w=(4,)), _masked(w=(4,))
    secure.add_masked("a", _reply(first))
    secure.add_masked("b", _reply(second))
    assert secure._masked == ["a", "b"]
    assert np.array_equal(secure._sum["w"], first["w"] + second["w"])  # uint64 wraps
