"""state_dict <-> params: shared memory where possible, copies only where they must be."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atoll.fl.bfloat16 import BF16
from atoll.fl.model import Model  # noqa: E402
from atoll.fl.serde import decode, encode  # noqa: E402
from atoll.fl.torch_bridge import load_params, to_params, to_state_dict  # noqa: E402


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2)
    )


def test_params_share_memory_with_the_module():
    net = _net()
    params = to_params(net)
    assert set(params) == set(net.state_dict())
    assert params["1.num_batches_tracked"].dtype == np.int64
    weight = net.state_dict()["0.weight"]
    assert np.shares_memory(params["0.weight"], weight.numpy())
    with torch.no_grad():
        net[0].weight.add_(1.0)  # the arrays see the module's live weights
    np.testing.assert_array_equal(params["0.weight"], net[0].weight.detach().numpy())


def test_round_trip_through_the_wire_into_a_fresh_module():
    source, target = _net(), _net()
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(3.0)
    back = decode(encode(Model(params=to_params(source))))
    load_params(target, back.params)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


def test_to_state_dict_is_zero_copy_for_writable_arrays_and_copies_read_only_ones():
    array = np.arange(6, dtype=np.float32)
    assert np.shares_memory(to_state_dict({"a": array})["a"].numpy(), array)
    frozen = np.frombuffer(array.tobytes(), dtype=np.float32)  # read-only buffer
    tensor = to_state_dict({"a": frozen})["a"]
    assert not np.shares_memory(tensor.numpy(), frozen)
    assert torch.equal(tensor, torch.arange(6, dtype=torch.float32))


def test_non_contiguous_and_bfloat16_tensors_are_converted():
    state = {"t": torch.arange(12.0).reshape(3, 4).t(), "h": torch.ones(3, dtype=torch.bfloat16)}
    params = to_params(state)
    np.testing.assert_array_equal(params["t"], np.arange(12.0).reshape(3, 4).T)
    assert params["t"].flags.c_contiguous
    assert params["h"].dtype == BF16  # numpy has no bfloat16: its words, tagged, shared
    assert np.shares_memory(params["h"], state["h"].view(torch.int16).numpy())
    assert to_state_dict(params)["h"].dtype == torch.bfloat16
    module = torch.nn.Module()
    module.register_buffer("h", torch.zeros(3, dtype=torch.bfloat16))
    load_params(module, {"h": params["h"]})
    assert module.h.dtype == torch.bfloat16 and torch.equal(module.h, state["h"])


def test_a_non_tensor_value_is_named():
    with pytest.raises(TypeError, match=r"state_dict\['x'\] is a int"):
        to_params({"x": 3})
