"""Exports the FLARE peer job (numpy FedAvg through FLARE's own recipe) to a job folder.

Run with the FLARE venv's python:
  make_job.py --out DIR --rounds 3 --layers 1024,1024 --mark-dir DIR
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_persistor import BenchModelPersistor  # noqa: E402
from nvflare.fuel.utils.constants import FrameworkType  # noqa: E402
from nvflare.recipe.fedavg import FedAvgRecipe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default="bench-fedavg")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--layers", required=True, help="comma-separated float32 counts per layer")
    parser.add_argument("--mark-dir", default="")
    args = parser.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    recipe = FedAvgRecipe(
        name=args.name,
        min_clients=args.clients,
        num_rounds=args.rounds,
        train_script=os.path.join(HERE, "client.py"),
        train_args=f"--mark-dir {args.mark_dir}" if args.mark_dir else "",
        framework=FrameworkType.NUMPY,
        model_persistor=BenchModelPersistor(layer_elems=layers),
    )
    recipe.export(args.out)
    print(os.path.join(args.out, args.name))


if __name__ == "__main__":
    main()
