"""The server-side workflows an app.yaml can name, registered explicitly (no import side effects).

Each built-in is a ``Workflow`` class of the public API (``atoll.fl.workflows.api``, also
``atoll.workflow``); ``BUILTINS`` maps its app.yaml name to it. A job may name its own class
instead (``workflow: my_workflow.py:MyWorkflow``; ``atoll.fl.runner`` loads it). The ``run_*``
functions take ``(channel, args, initial_model, job_args)`` and run one built-in directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.workflows.api import BuiltinArgs, Context, Workflow
from atoll.fl.workflows.fedavg import FedAvg, FedAvgFamily, FedAvgRun, run_fedavg
from atoll.fl.workflows.fedopt import FedOpt, run_fedopt
from atoll.fl.workflows.rounds import WorkflowError
from atoll.fl.workflows.scatter_gather import ScatterGather, run_scatter_gather

if TYPE_CHECKING:  # the model loads on first use (api.BuiltinArgs)
    from atoll.fl.app_config import FedProxArgs


class FedProx(FedAvgFamily):
    """FedProx (Li et al. 2020): FedAvg on the server; the sites add the proximal term
    (``atoll.fl.fedprox.proximal_term``) with the ``mu`` they find in ``model.meta['fedprox_mu']``."""

    Args = BuiltinArgs("FedProxArgs")

    def make_loop(self) -> FedAvgRun:
        return FedAvgRun.on(self.ctx, "fedprox", site_meta={"fedprox_mu": self.args.mu})


def run_fedprox(
    channel: ServerChannel, args: FedProxArgs, initial: Model | None, job_args: dict[str, Any]
) -> None:
    FedProx(Context(channel, args, initial, job_args)).run()


BUILTINS: dict[str, type[Workflow]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedopt": FedOpt,
    "scatter_gather": ScatterGather,
}

__all__ = [
    "BUILTINS",
    "WorkflowError",
    "run_fedavg",
    "run_fedopt",
    "run_fedprox",
    "run_scatter_gather",
]
