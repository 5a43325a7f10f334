"""Writes the atoll peer job of bench/compare: FedAvg, train only, over the benchmark's model.

Run with atoll's venv python:
  make_job.py --out DIR --name NAME --rounds 3 --layers 1024,1024 --mark-dir DIR

The job has two apps: `server` (the workflow and the initial model, float32 layers drawn like
the other systems' models) and `site` (site_train.py). The initial model ships with the server's
app only, so a site does not download a model file it never reads; every round's model still
travels to both sites. Validation and cross-site evaluation are off, so every system runs the
same workload: train rounds only.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from atoll.fl.model import Model
from atoll.fl.serde import save_file

HERE = Path(__file__).resolve().parent

APP_YAML_SERVER = """\
server:
  workflow: fedavg
  args:
    num_rounds: {rounds}
    min_clients: {clients}
    round_timeout: 3600
    evaluate_every: 0
    cross_site_eval: none
  initial_model: model.safetensors
"""

APP_YAML_SITE = """\
site:
  script: train.py
  args: {args}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", default="bench-fedavg")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--layers", required=True, help="comma-separated float32 counts per layer")
    parser.add_argument("--mark-dir", default="")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    job = Path(args.out) / args.name
    if job.exists():
        shutil.rmtree(job)
    (job / "server").mkdir(parents=True)
    (job / "site").mkdir()
    sites = [f"site-{i}" for i in range(1, args.clients + 1)]
    meta = {
        "name": args.name,
        "deploy_map": {"server": ["server"], "site": sites},
        "min_clients": args.clients,
    }
    (job / "meta.json").write_text(json.dumps(meta, indent=1))
    (job / "server" / "app.yaml").write_text(
        APP_YAML_SERVER.format(rounds=args.rounds, clients=args.clients)
    )
    site_args = json.dumps(["--mark-dir", args.mark_dir] if args.mark_dir else [])
    (job / "site" / "app.yaml").write_text(APP_YAML_SITE.format(args=site_args))
    shutil.copyfile(HERE / "site_train.py", job / "site" / "train.py")
    rng = np.random.default_rng(args.seed)
    params = {f"layer{i}": rng.random(n, dtype=np.float32) for i, n in enumerate(layers)}
    save_file(Model(params=params), job / "server" / "model.safetensors")
    print(job)


if __name__ == "__main__":
    main()
