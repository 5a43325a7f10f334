"""The checks a private round (fl/workflows/secure.py) makes before anything is sent: an int
round, a model with params to update against, known targets; a job without a privacy section
gets no ServerPrivacy; a secure round's metrics mean is unweighted (the example counts travel
masked). The rounds themselves: tests/unit/fl/privacy/test_secure_workflow_api.py."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.model import Model
from atoll.fl.simulator import Federation
from atoll.fl.workflows.api import Context
from atoll.fl.workflows.rounds import WorkflowError
from atoll.fl.workflows.secure import SecureResult, private_round, server_privacy


class NeverUsed:
    """A ServerPrivacy that fails the test if a refused round reached it."""

    secure = True

    def train_round(self, *args, **kwargs):
        raise AssertionError("a refused round was sent")


@pytest.fixture
def ctx(tmp_path):
    federation = Federation(["site-1", "site-2"], tmp_path)
    yield Context(federation.server_channel(), {}, None, {})
    federation.close()


MODEL = Model(params={"w": np.zeros(2)})


@pytest.mark.parametrize("round_", [True, 1.0, "1", None])
def test_a_round_that_is_not_an_int_is_refused(ctx, round_):
    with pytest.raises(WorkflowError, match="a private round needs an int round"):
        private_round(ctx, NeverUsed(), MODEL, round=round_)


def test_a_model_without_params_is_refused_with_what_to_set(ctx):
    with pytest.raises(WorkflowError, match="set server.initial_model in app.yaml"):
        private_round(ctx, NeverUsed(), Model(), round=1)


def test_an_unknown_target_is_refused(ctx):
    with pytest.raises(WorkflowError, match=r"round 2: unknown site\(s\) \['site-9'\]"):
        private_round(ctx, NeverUsed(), MODEL, round=2, targets=["site-1", "site-9"])


def test_no_privacy_section_means_no_server_privacy():
    assert server_privacy({}) is None
    assert server_privacy({"min_clients": 2}) is None


def test_a_secure_rounds_metrics_mean_ignores_example_counts():
    result = SecureResult(round=1, aggregate={},
                          metrics={"site-1": {"loss": 1.0}, "site-2": {"loss": 3.0, "acc": 0.5}})
    assert result.mean_metrics() == {"loss": 2.0, "acc": 0.5}
