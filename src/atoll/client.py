"""The API a site's training script uses: ``import atoll.client as fl``.

```python
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()                    # fl.Model: params, round, total_rounds, meta
    if fl.is_evaluate():                    # the server asks for an evaluation only
        fl.send(fl.Model(metrics=evaluate(model.params), num_examples=n_val))
        continue
    params, n = train(model.params)         # numpy arrays (torch: atoll.fl.torch_bridge)
    fl.send(fl.Model(params=params, num_examples=n, metrics={"loss": loss}))
```

Or hand the evaluation to ``fl.init(evaluate=fn)`` (``fn(model) -> {metric: value}``): then
``validate`` tasks are answered inside ``is_running()``/``receive()`` and the loop sees only
training tasks, exactly as in the short form ``fl.init(); while fl.is_running(): ...``.

A task arrives as one of two topics: ``train`` (send back the trained weights, full or
``params_type="diff"``, with ``num_examples``) and ``validate`` (send back ``metrics`` and the
number of examples evaluated; weights are not sent back). ``fl.receive()`` returns ``None`` once
the job is over. The script runs inside the site worker; an exception fails this site's part of
the job, with the traceback in the job's logs.

A site may train with several processes (``torch.distributed``, e.g. DDP): every process runs
the script and calls the same functions in the same order. Rank 0 alone talks to the parent:
``fl.receive()`` gives every rank the same model (rank 0 broadcasts it), ``fl.send()`` answers
from rank 0 only, and ``fl.init()`` joins the process group the launcher prepared
(``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``...). ``fl.rank()``, ``fl.world_size()`` and
``fl.local_rank()`` say where the process stands; see docs/distributed.md.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from atoll.fl.client_runtime import VALIDATE, ClientError, Evaluator, current
from atoll.fl.model import Model

__all__ = [
    "ClientError",
    "Model",
    "dataset_path",
    "init",
    "is_evaluate",
    "is_running",
    "is_train",
    "job_args",
    "job_id",
    "local_rank",
    "log_metrics",
    "rank",
    "receive",
    "send",
    "site_name",
    "task_name",
    "world_size",
]


def init(evaluate: Evaluator | None = None) -> None:
    """Start using the job's channel. ``evaluate(model) -> metrics`` answers validate tasks."""
    session = current()
    session.evaluator = evaluate
    if session.broadcast is not None:
        session.broadcast.setup()
    session.initialized = True


def is_running() -> bool:
    """True while the job has work for this site (waits for the next task); False at the end."""
    return current().is_running()


def receive(timeout: float | None = None) -> Model | None:
    """The model of the current task (the same one until ``send``); None once the job is over."""
    return current().receive(timeout)


def send(model: Model) -> None:
    """Answer the current task with ``model``."""
    current().send(model)


def task_name() -> str | None:
    """The current task's topic: "train", "validate", or a custom workflow's topic."""
    return current().topic


def is_train() -> bool:
    return task_name() == "train"


def is_evaluate() -> bool:
    return task_name() == VALIDATE


def rank() -> int:
    """This process's rank among the site's processes (0 talks to the parent)."""
    return current().ranks.rank


def world_size() -> int:
    """How many processes train for this site (1 unless the job asked for several)."""
    return current().ranks.world_size


def local_rank() -> int:
    """This process's rank on its node: the index of its GPU where it sees all of them."""
    return current().ranks.local_rank


def site_name() -> str:
    return current().site


def job_id() -> str:
    return current().channel.job_id


def job_args() -> dict[str, Any]:
    """The job's settings for the site script: ``site.config`` in app.yaml."""
    return dict(current().config)


def dataset_path(name: str) -> Path:
    """Where the study's dataset ``name`` is for this site: ``/data/<study>/<name>`` in a
    container, the mapped host path with the process launcher. Unknown names raise an error
    listing the mapped ones."""
    return current().dataset_path(name)


def log_metrics(metrics: dict[str, float], step: int | None = None) -> None:
    """Record intermediate metrics (e.g. per epoch): in the job's status and logs and the site's
    experiment tracker right away, and in the job's metrics files and plot (phase ``log``) with
    this site's next training result."""
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"fl.log_metrics(step=...) takes an integer, got {step!r}")
        step = int(step)  # numpy's integers too
    clean = Model(metrics=metrics).metrics  # validates: names -> floats
    current().log_metrics(clean, step)
