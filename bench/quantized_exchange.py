"""What 8-bit quantized exchange costs in accuracy, and what it saves in bytes.

The same FedAvg job, run in the simulator (`atoll.fl.simulator.simulate`: the real client
runtime, site privacy pipeline, serde and FedAvg) four ways: float32 both ways; the sites'
updates 8-bit (`privacy.filters.reply: [{type: quantize}]`); the server's model 8-bit too
(`filters.task` as well); and both with one block per tensor instead of 256 values a block. The task: 10-class synthetic classification (Gaussian clusters in 32
dimensions, each site's classes skewed), a numpy MLP 32-256-10 (float32; its two weight
matrices are quantized, the biases are tiny and travel as they are), 4 sites, local SGD. The
final global model is scored on a held-out test set of 5,000 examples, the same for every run.
Bytes per round are what `serde.encode` writes for one round's tasks and replies (the model's
shapes fix them: they do not depend on the values). Data, initial model and SGD are seeded; the
order in which replies arrive is not, and it moves a rerun's numbers a little (BENCHMARKS.md).

    .venv/bin/python -m bench.quantized_exchange [--rounds 30] [--sites 4] [--seeds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

from atoll.fl.model import Model
from atoll.fl.serde import encode, load_file
from atoll.fl.simulator import simulate
from atoll.spec.privacy import QuantizeFilter

DATA = '''
import zlib

import numpy as np

CLASSES, FEATURES, HIDDEN = 10, 32, 256


def centers():
    return np.random.default_rng(2026).normal(0, 1.0, (CLASSES, FEATURES))


def draw(seed, n, skew=None):
    """n examples; skew: class weights (a site's own mix)."""
    rng = np.random.default_rng(seed)
    p = np.ones(CLASSES) / CLASSES if skew is None else skew
    y = rng.choice(CLASSES, size=n, p=p)
    x = centers()[y] + rng.normal(0, 2.2, (n, FEATURES))
    return x.astype(np.float32), y


def site_data(site, n=2000):
    seed = zlib.crc32(site.encode())
    skew = np.random.default_rng(seed).dirichlet(np.full(CLASSES, 1.0))
    x, y = draw(seed, n, skew)
    return (x[: n * 3 // 4], y[: n * 3 // 4]), (x[n * 3 // 4 :], y[n * 3 // 4 :])


def forward(params, x):
    h = np.maximum(x @ params["fc1.weight"] + params["fc1.bias"], 0)
    logits = h @ params["fc2.weight"] + params["fc2.bias"]
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return h, p / p.sum(axis=1, keepdims=True)


def score(params, x, y):
    _, p = forward(params, x)
    loss = float(-np.mean(np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None))))
    return {"accuracy": float(np.mean(p.argmax(axis=1) == y)), "loss": loss}


def sgd(params, x, y, epochs, lr, batch, seed):
    rng = np.random.default_rng(seed)
    params = {k: v.astype(np.float32, copy=True) for k, v in params.items()}
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch):
            i = order[start : start + batch]
            h, p = forward(params, x[i])
            p[np.arange(len(i)), y[i]] -= 1
            g = p / len(i)
            grads = {"fc2.weight": h.T @ g, "fc2.bias": g.sum(0)}
            gh = (g @ params["fc2.weight"].T) * (h > 0)
            grads.update({"fc1.weight": x[i].T @ gh, "fc1.bias": gh.sum(0)})
            for k, v in grads.items():
                params[k] -= np.float32(lr) * v.astype(np.float32)
    return params
'''

MODEL = '''
import numpy as np
from data import CLASSES, FEATURES, HIDDEN
from atoll.fl.model import Model


def make():
    rng = np.random.default_rng(7)
    return Model(params={
        "fc1.weight": (rng.normal(0, 1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        "fc1.bias": np.zeros(HIDDEN, np.float32),
        "fc2.weight": (rng.normal(0, 1, (HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32),
        "fc2.bias": np.zeros(CLASSES, np.float32)})
'''

TRAIN = '''
import atoll.client as fl
from data import score, sgd, site_data

(x, y), (x_val, y_val) = site_data(fl.site_name())
fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics=score(model.params, x_val, y_val), num_examples=len(y_val)))
        continue
    params = sgd(model.params, x, y, epochs=1, lr=0.05, batch=32, seed=model.current_round)
    fl.send(fl.Model(params=params, num_examples=len(y), metrics=score(params, x, y)))
'''

MODES = {
    "float32 both ways": "",
    "8-bit updates (filters.reply)": "privacy:\n  filters:\n    reply: [{type: quantize}]\n",
    "8-bit both ways (filters.reply and filters.task)":
        "privacy:\n  filters:\n    task: [{type: quantize}]\n    reply: [{type: quantize}]\n",
    "8-bit both ways, one block per tensor (block_size: 65536)":
        "privacy:\n  filters:\n    task: [{type: quantize, block_size: 65536}]\n"
        "    reply: [{type: quantize, block_size: 65536}]\n",
}


def _job(folder: Path, rounds: int, sites: int, privacy: str) -> Path:
    app = folder / "app"
    app.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(
        {"name": "q8", "deploy_map": {"app": ["@ALL"]}, "min_clients": sites}))
    (app / "app.yaml").write_text(
        "server:\n  workflow: fedavg\n"
        f"  args: {{num_rounds: {rounds}, key_metric: accuracy, cross_site_eval: none}}\n"
        "  initial_model: model.py:make\nsite:\n  script: train.py\n" + privacy)
    (app / "data.py").write_text(DATA)
    (app / "model.py").write_text(MODEL)
    (app / "train.py").write_text(TRAIN)
    return folder


def _data_module(app: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("q8_bench_data", app / "data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bytes(model: Model, quantize: QuantizeFilter | None) -> int:
    return sum(len(c) for c in encode(model, quantize=quantize))


def round_bytes(params: dict[str, np.ndarray], sites: int, privacy: str) -> int:
    """One round's tasks and replies on the wire: the model to each site, an update back."""
    block = 65536 if "65536" in privacy else 256
    q8 = QuantizeFilter(type="quantize", block_size=block)
    task = _bytes(Model(params=params, round=1), q8 if "task:" in privacy else None)
    reply = _bytes(Model(params=params, params_type="diff", num_examples=600),
                   q8 if "reply:" in privacy else None)
    return sites * (task + reply)


def run(rounds: int, sites: int, seed_count: int, workdir: Path) -> list[dict]:
    names = [f"site-{i}" for i in range(1, sites + 1)]
    rows = []
    for mode, privacy in MODES.items():
        scores = []
        for repeat in range(seed_count):
            folder = workdir / f"{len(rows)}-{repeat}"
            job = _job(folder / "job", rounds, sites, privacy)
            # each repeat: other sites (their data and class mix), the same test set
            result = simulate(job, {f"{n}-r{repeat}": {} for n in names},
                              results_dir=folder / "results")
            final = load_file(result.results_dir / "global_model_final.safetensors").params
            data = _data_module(job / "app")
            x_test, y_test = data.draw(99, 5000)
            scores.append(data.score(final, x_test, y_test))
        rows.append({"mode": mode, "bytes": round_bytes(final, sites, privacy),
                     "accuracy": [s["accuracy"] for s in scores],
                     "loss": [s["loss"] for s in scores]})
    return rows


def table(rows: list[dict], rounds: int, sites: int, seeds: int, command: str) -> str:
    plain = rows[0]
    out = [f"    {command}", "",
           f"FedAvg, {sites} sites, {rounds} rounds, mean over {seeds} runs (each its own sites' "
           "data); the test set is the same 5,000 examples for every run.", "",
           "| exchange | test accuracy | test loss | bytes per round | vs float32 |",
           "| --- | --- | --- | --- | --- |"]
    for row in rows:
        acc, loss = statistics.mean(row["accuracy"]), statistics.mean(row["loss"])
        spread = (f" (runs {min(row['accuracy']):.4f}-{max(row['accuracy']):.4f})"
                  if len(row["accuracy"]) > 1 else "")
        delta = ("" if row is plain else
                 f"; accuracy {100 * (acc - statistics.mean(plain['accuracy'])):+.2f} points, "
                 f"loss {loss - statistics.mean(plain['loss']):+.4f}")
        out.append(f"| {row['mode']} | {acc:.4f}{spread} | {loss:.4f} | {row['bytes']:,} | "
                   f"{row['bytes'] / plain['bytes']:.3f}{delta} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3, help="runs per mode, other sites each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="atoll-q8-") as workdir:
        rows = run(args.rounds, args.sites, args.seeds, Path(workdir))
    command = (".venv/bin/python -m bench.quantized_exchange --rounds "
               f"{args.rounds} --sites {args.sites} --seeds {args.seeds}")
    print(table(rows, args.rounds, args.sites, args.seeds, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
