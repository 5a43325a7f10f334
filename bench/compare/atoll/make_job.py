"""Writes the atoll peer job of bench/compare: FedAvg, train only, over the benchmark's model.

Run with atoll's venv python:
  make_job.py --out DIR --name NAME --rounds 3 --layers 1024,1024 --mark-dir DIR

One app for `@ALL` (the server and both sites), min_clients 2, validation and cross-site
evaluation off, so every system runs the same workload: train rounds only. No model file ships
with the job (atoll refuses job uploads over 1 GiB, and no peer ships its model with the job
either: FLARE's persistor and Flower's ServerApp make it in place on the server). FedAvg starts
without a global model, so round 0 hands each site an empty model and the site makes the float32
layers of `--layers` in place (site.config.layers); from round 1 on the global model travels to
both sites and back every round, as in the other systems. Per-round time is measured between
arrivals of consecutive rounds' models at a site, so each interval holds one upload, one
aggregation and one download in every system.
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
site:
  script: train.py
  args: {args}
  config: {{layers: {layers}}}
"""


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
    job = Path(args.out) / args.name
    if job.exists():
        shutil.rmtree(job)
    (job / "app").mkdir(parents=True)
    meta = {"name": args.name, "deploy_map": {"app": ["@ALL"]}, "min_clients": args.clients}
    (job / "meta.json").write_text(json.dumps(meta, indent=1))
    site_args = json.dumps(["--mark-dir", args.mark_dir] if args.mark_dir else [])
    (job / "app" / "app.yaml").write_text(
        APP_YAML.format(
            rounds=args.rounds, clients=args.clients, args=site_args, layers=json.dumps(layers)
        )
    )
    shutil.copyfile(HERE / "site_train.py", job / "app" / "train.py")
    print(job)


if __name__ == "__main__":
    main()
