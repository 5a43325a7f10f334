"""Writes the atoll peer job of bench/compare: FedAvg, train only, over the benchmark's model.

Run with atoll's venv python:
  make_job.py --out DIR --name NAME --rounds 3 --layers 1024,1024 --mark-dir DIR

One app for `@ALL` (the server and both sites), min_clients 2, validation and cross-site
evaluation off, so every system runs the same workload: train rounds only. No model file ships
with the job: the server worker makes the float32 layers of `--layers` in place, random with seed
0, through app.yaml's `initial_model: model.py:make`, as FLARE's persistor and Flower's ServerApp
do (bench/compare/flare/bench_persistor.py, bench/compare/flower/app). The global model travels to
both sites and back every round, the first round included. Per-round time is measured between arrivals of
consecutive rounds' models at a site, so each interval holds one upload, one aggregation and one
download in every system.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent

APP_YAML = """\
server:
  workflow: fedavg
  args:
    num_rounds: {rounds}
    min_clients: {clients}
    round_timeout: 3600
    evaluate_every: 0
    cross_site_eval: none
    accumulator: {accumulator}
  initial_model: model.py:make
site:
  script: train.py
  args: {args}
"""

MODEL_PY = """\
import numpy as np

LAYERS = {layers}


def make():
    rng = np.random.default_rng(0)
    return {{f"layer{{i}}": rng.random(n, dtype=np.float32) for i, n in enumerate(LAYERS)}}
"""

# bf16 (issue 40): random words of values in [1, 2), made as bf16 (no float32 detour)
MODEL_BF16_PY = """\
import numpy as np

from atoll.fl import bfloat16

LAYERS = {layers}


def make():
    rng = np.random.default_rng(0)
    return {{f"layer{{i}}": bfloat16.from_words(rng.integers(0x3F80, 0x4000, n, dtype=np.uint16))
             for i, n in enumerate(LAYERS)}}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default="bench-fedavg")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--layers", required=True, help="comma-separated element counts per layer")
    parser.add_argument("--dtype", choices=["float32", "bf16"], default="float32")
    parser.add_argument("--accumulator", choices=["memory", "disk"], default="memory")
    parser.add_argument("--mark-dir", default="")
    parser.add_argument("--mark-sub", default="",
                        help="the job's own folder in the site's marks dataset")
    args = parser.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    job = Path(args.out) / args.name
    if job.exists():
        shutil.rmtree(job)
    (job / "app").mkdir(parents=True)
    meta = {"name": args.name, "deploy_map": {"app": ["@ALL"]}, "min_clients": args.clients}
    (job / "meta.json").write_text(json.dumps(meta, indent=1))
    site_args = json.dumps((["--mark-dir", args.mark_dir] if args.mark_dir else [])
                           + (["--mark-sub", args.mark_sub] if args.mark_sub else []))
    (job / "app" / "app.yaml").write_text(
        APP_YAML.format(
            rounds=args.rounds, clients=args.clients, args=site_args,
            accumulator=args.accumulator,
        )
    )
    source = MODEL_BF16_PY if args.dtype == "bf16" else MODEL_PY
    (job / "app" / "model.py").write_text(source.format(layers=json.dumps(layers)))
    shutil.copyfile(HERE / "site_train.py", job / "app" / "train.py")
    print(job)


if __name__ == "__main__":
    main()
