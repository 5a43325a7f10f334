"""Decoding into the arrays of the model last sent, only when nobody else holds them."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import atoll.client as fl
from atoll.fl.client_runtime import ClientSession, bind, unbind
from atoll.fl.model import Model
from atoll.fl.serde import ModelStream, encode
from atoll.fl.simulator import Federation

SHAPE = (64, 32)


def _model(value):
    return Model(params={"w": np.full(SHAPE, value, dtype=np.float32)}, num_examples=1)


def _decode(value, spare):
    return ModelStream(encode(_model(value))).read(spare=spare)


def test_an_array_nobody_holds_is_filled_again():
    first = _decode(1.0, {})
    was = weakref.ref(first.params["w"])  # a weak reference does not count as holding it
    spare = dict(first.params)
    del first
    second = _decode(2.0, spare)
    assert second.params["w"] is was()  # the same array, refilled
    assert (second.params["w"] == 2.0).all() and spare == {}


@pytest.mark.parametrize("hold", ["variable", "view", "list"])
def test_an_array_still_held_is_left_alone(hold):
    first = _decode(1.0, {})
    array = first.params["w"]
    kept = {"variable": array, "view": array[:3], "list": [array]}[hold]
    spare = dict(first.params)
    del first, array
    second = _decode(2.0, spare)
    original = kept if hold == "variable" else kept[0] if hold == "list" else kept.base
    assert second.params["w"] is not original
    assert (original == 1.0).all()  # what the script kept is untouched


def test_a_torch_tensor_made_from_an_array_keeps_it():
    import torch
    first = _decode(1.0, {})
    tensor = torch.from_numpy(first.params["w"])
    spare = dict(first.params)
    del first
    _decode(2.0, spare)
    assert bool((tensor == 1.0).all())


def test_arrays_that_do_not_match_or_are_not_ours_are_not_used():
    foreign = np.zeros(SHAPE[0] * SHAPE[1] * 2, dtype=np.float32)[: SHAPE[0] * SHAPE[1]]
    for spare in ({"w": np.zeros((3,), np.float32)}, {"w": np.zeros(SHAPE, np.float64)},
                  {"w": foreign.reshape(SHAPE)}):
        out = _decode(2.0, spare)
        assert (out.params["w"] == 2.0).all()
    assert (foreign == 0).all()


def test_the_client_loop_reuses_the_sent_model_once_the_script_lets_go(tmp_path):
    federation = Federation(["a"], tmp_path)
    bind(ClientSession(federation.site_channel("a"), "a"), thread_only=True)
    try:
        arrays = []
        for round_ in range(3):
            federation.send(["a"], "train", {"round": round_}, encode(_model(float(round_))))
            model = fl.receive()
            params = model.params
            assert (params["w"] == round_).all()
            arrays.append(weakref.ref(params["w"]))
            np.add(params["w"], 1.0, out=params["w"])
            fl.send(fl.Model(params=params, num_examples=1))
            del model, params
        assert arrays[0]() is not None and arrays[0]() is arrays[1]() is arrays[2]()
    finally:
        unbind(thread_only=True)
        federation.close()
