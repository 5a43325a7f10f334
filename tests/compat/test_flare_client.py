"""``atoll.compat.flare_client``: FLARE's FLModel on atoll's Model (the run through a real
federation is test_flare_job_runs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atoll.compat import flare_client as flare


def test_fl_model_has_flares_fields_and_defaults():
    model = flare.FLModel()
    assert (model.params_type, model.params, model.metrics, model.start_round,
            model.current_round, model.total_rounds, model.meta) == (
        None, None, None, 0, None, None, {})


@pytest.mark.parametrize(("meta", "weight"), [
    pytest.param({"NUM_STEPS_CURRENT_ROUND": 12}, 12, id="aggregation-weight-from-meta"),
    pytest.param({}, 1, id="default-weight-1-as-in-flare"),
    pytest.param({"NUM_STEPS_CURRENT_ROUND": "12"}, 1, id="not-a-number-weighs-1"),
])
def test_send_weighs_by_num_steps_current_round(meta, weight):
    assert flare._to_atoll(flare.FLModel(params={"w": np.ones(2)}, meta=meta)).num_examples \
        == weight


def test_torch_state_dict_params_become_numpy():
    sent = flare._to_atoll(flare.FLModel(params={"w": torch.ones(2, 3)},
                                         params_type=flare.ParamsType.DIFF))
    assert isinstance(sent.params["w"], np.ndarray) and sent.params["w"].shape == (2, 3)
    assert sent.params_type == "diff"


def test_meta_that_is_not_json_is_dropped_not_fatal():
    sent = flare._to_atoll(flare.FLModel(metrics={"acc": 1}, meta={"ok": 1, "obj": object()}))
    assert sent.meta == {"ok": 1}


def test_send_refuses_what_is_not_an_fl_model():
    with pytest.raises(TypeError, match="FLModel"):
        flare.send({"params": {}})
