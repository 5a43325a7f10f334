"""The server-side workflows an app.yaml can name, registered explicitly (no import side effects).

Each entry takes ``(channel, args, initial_model, job_args)``; ``args`` is the validated
``server.args`` model of ``atoll.fl.app_config.WORKFLOW_ARGS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atoll.fl.app_config import FedProxArgs
from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.workflows.fedavg import run_fedavg
from atoll.fl.workflows.fedopt import run_fedopt
from atoll.fl.workflows.rounds import WorkflowError
from atoll.fl.workflows.scatter_gather import run_scatter_gather


def run_fedprox(
    channel: ServerChannel, args: FedProxArgs, initial: Model | None, job_args: dict[str, Any]
) -> None:
    """FedProx (Li et al. 2020): FedAvg on the server; the sites add the proximal term
    (``atoll.fl.fedprox.proximal_term``) with the ``mu`` they find in ``model.meta['fedprox_mu']``."""
    run_fedavg(
        channel, args, initial, job_args, workflow="fedprox", site_meta={"fedprox_mu": args.mu}
    )


WORKFLOWS: dict[str, Callable[..., None]] = {
    "fedavg": run_fedavg,
    "fedprox": run_fedprox,
    "fedopt": run_fedopt,
    "scatter_gather": run_scatter_gather,
}

__all__ = [
    "WORKFLOWS",
    "WorkflowError",
    "run_fedavg",
    "run_fedopt",
    "run_fedprox",
    "run_scatter_gather",
]
