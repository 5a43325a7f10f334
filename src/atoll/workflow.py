"""The API a job's server-side workflow uses: ``from atoll.workflow import Workflow, Context``.

A workflow is a class of the job's app folder, named in its app.yaml next to the built-ins:

```yaml
server:
  workflow: my_workflow.py:MyWorkflow
  args: {num_rounds: 5}            # self.args (validated with MyWorkflow.Args when it has one)
```

It runs in the server's job worker, confined like every worker: through its ``Context`` it
reaches the job's sites and its results folder, nothing else. docs/federated-learning.md walks
through a complete one; the built-in workflows (``atoll.fl.workflows``) are written on it too.
"""

from __future__ import annotations

from atoll.fl.aggregation import ResultRejected
from atoll.fl.aggregators import CoordinateMedian, TrimmedMean, WeightedAverage
from atoll.fl.model import Model
from atoll.fl.workflows.api import (
    Aggregator,
    Context,
    Filter,
    Gathered,
    Params,
    SecureResult,
    Sent,
    StreamingAggregator,
    Workflow,
)
from atoll.fl.workflows.rounds import WorkflowError

__all__ = [
    "Aggregator",
    "Context",
    "CoordinateMedian",
    "Filter",
    "Gathered",
    "Model",
    "Params",
    "ResultRejected",
    "SecureResult",
    "Sent",
    "StreamingAggregator",
    "TrimmedMean",
    "WeightedAverage",
    "Workflow",
    "WorkflowError",
]
