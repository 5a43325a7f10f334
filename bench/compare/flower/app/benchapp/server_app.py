"""ServerApp: Flower's FedAvg over the benchmark's model (float32 layers made in place)."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config["num-server-rounds"])
    layers = [int(n) for n in str(context.run_config["layers"]).split(",")]
    rng = np.random.default_rng(0)
    arrays = ArrayRecord([rng.random(n, dtype=np.float32) for n in layers])
    strategy = FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2
    )
    strategy.start(
        grid=grid, initial_arrays=arrays, num_rounds=rounds, train_config=ConfigRecord({})
    )
