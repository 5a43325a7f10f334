"""The hospitals demo's data and its yardsticks: each site alone, and all data in one place.

Data: scikit-learn's handwritten digits (1,797 8x8 images, shipped inside the package: no
download). A quarter is held out as the shared test split. The rest is dealt to three
"hospitals", non-IID: each sees mostly its own digits (hospital-1: 0-3, hospital-2: 4-6,
hospital-3: 7-9; a sample goes to its home site with probability 0.8, else to any site). Each
site keeps a fifth of its slice for local validation (federated evaluation).

Alone, a site rarely sees the other sites' digits and misclassifies them; federated training
learns all ten while no image leaves its site.

    python -m atoll.demo.data prepare DATA_DIR          # the .npz files, one folder per site
    python -m atoll.demo.data compare RESULTS DATA_DIR  # federated vs alone vs centralized
    python -m atoll.demo.data simulate DATA_DIR         # the job in one process, then compare

``DATA_DIR/<site>`` is what each site maps as the study dataset ``records``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

SITES = ("hospital-1", "hospital-2", "hospital-3")
HOME_DIGITS = ((0, 1, 2, 3), (4, 5, 6), (7, 8, 9))
HOME_SHARE = 0.8
TEST_FRACTION = 0.25
VAL_FRACTION = 0.2
SEED = 0
DATASET = "records"
JOB_DIR = Path(__file__).resolve().parents[3] / "examples" / "hospitals"  # in a source checkout


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as sklearn_digits

    x, y = sklearn_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)  # pixel range 0..16, no data stats


def split(seed: int = SEED) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """(site -> {x_train, y_train, x_val, y_val}, {x, y} of the shared test split)."""
    x, y = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    n_test = int(round(TEST_FRACTION * len(x)))
    test, rest = order[:n_test], order[n_test:]
    home = {digit: i for i, digits in enumerate(HOME_DIGITS) for digit in digits}
    owner = np.array(
        [
            home[int(y[i])] if rng.random() < HOME_SHARE else int(rng.integers(len(SITES)))
            for i in rest
        ]
    )
    sites: dict[str, dict[str, np.ndarray]] = {}
    for index, site in enumerate(SITES):
        mine = rest[owner == index]
        n_val = int(round(VAL_FRACTION * len(mine)))
        val, train = mine[:n_val], mine[n_val:]
        sites[site] = {"x_train": x[train], "y_train": y[train], "x_val": x[val], "y_val": y[val]}
    return sites, {"x": x[test], "y": y[test]}


def prepare(out_dir: str | Path, seed: int = SEED) -> dict[str, Path]:
    """Write ``out_dir/<site>/{train,val,test}.npz``; returns site -> folder (its ``records``)."""
    sites, test = split(seed)
    folders = {}
    for site, data in sites.items():
        folder = Path(out_dir) / site
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "train.npz", x=data["x_train"], y=data["y_train"])
        np.savez(folder / "val.npz", x=data["x_val"], y=data["y_val"])
        np.savez(folder / "test.npz", x=test["x"], y=test["y"])  # shared, for the comparison only
        folders[site] = folder
    return folders


def _load(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(folder / f"{name}.npz") as data:
        return data["x"], data["y"]


def job_settings(job_dir: str | Path = JOB_DIR) -> tuple[dict[str, Any], int]:
    """The demo job's site ``config`` and ``num_rounds``, read from its app.yaml."""
    from atoll.fl.app_config import load_app_config

    config, args = load_app_config(Path(job_dir) / "app")
    if config.site is None or args is None:
        raise ValueError(f"{job_dir}/app/app.yaml needs server and site sections")
    return dict(config.site.config), int(args.num_rounds)  # type: ignore[attr-defined]


def baselines(data_dir: str | Path, job_dir: str | Path = JOB_DIR) -> dict[str, float]:
    """Test accuracy of the same model trained for as many epochs on each site alone and on all
    sites' training data together (centralized)."""
    import torch

    from atoll.demo.task import TrainSettings, evaluate, make_model, train

    torch.set_num_threads(1)  # like each site's worker (num_of_cpus 1): a tiny model, no gain
    config, rounds = job_settings(job_dir)
    settings = TrainSettings.from_config(config)
    epochs = rounds * settings.epochs
    folders = {site: Path(data_dir) / site for site in SITES}
    x_test, y_test = _load(folders[SITES[0]], "test")
    result, xs, ys = {}, [], []
    for site, folder in folders.items():
        x, y = _load(folder, "train")
        xs.append(x)
        ys.append(y)
        net = make_model()
        train(net, x, y, epochs, settings, seed=settings.seed)
        result[site] = evaluate(net, x_test, y_test)["accuracy"]
    net = make_model()
    train(net, np.concatenate(xs), np.concatenate(ys), epochs, settings, seed=settings.seed)
    result["centralized"] = evaluate(net, x_test, y_test)["accuracy"]
    return result


def federated_accuracy(
    results_dir: str | Path,
    data_dir: str | Path,
    model_file: str = "global_model_final.safetensors",
) -> float:
    from atoll.demo.task import evaluate, make_model
    from atoll.fl.serde import load_file
    from atoll.fl.torch_bridge import load_params

    net = make_model()
    load_params(net, load_file(Path(results_dir) / model_file).params)
    x_test, y_test = _load(Path(data_dir) / SITES[0], "test")
    return evaluate(net, x_test, y_test)["accuracy"]


def compare(
    results_dir: str | Path, data_dir: str | Path, job_dir: str | Path = JOB_DIR
) -> dict[str, float]:
    return {"federated": federated_accuracy(results_dir, data_dir), **baselines(data_dir, job_dir)}


def format_comparison(scores: dict[str, float]) -> str:
    lines = ["test accuracy on the shared held-out split:"]
    for name, value in scores.items():
        lines.append(f"  {name:<12} {100 * value:6.2f} %")
    best_single = max(scores[s] for s in SITES)
    lines.append(
        f"  federated vs best single site: {100 * (scores['federated'] - best_single):+.2f} points; "
        f"vs centralized: {100 * (scores['federated'] - scores['centralized']):+.2f} points"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atoll.demo.data", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write each site's slice and the test split")
    p.add_argument("data_dir")
    p = sub.add_parser("compare", help="federated model vs each site alone vs centralized")
    p.add_argument("results_dir")
    p.add_argument("data_dir")
    p.add_argument("--job", default=str(JOB_DIR))
    p.add_argument("--format", choices=("text", "json"), default="text")
    p = sub.add_parser("simulate", help="prepare, run the job in one process, compare")
    p.add_argument("data_dir")
    p.add_argument("--job", default=str(JOB_DIR))
    args = parser.parse_args(argv)
    if args.command == "prepare":
        for site, folder in prepare(args.data_dir).items():
            print(f"{site}: {folder}")
        return 0
    if args.command == "compare":
        scores = compare(args.results_dir, args.data_dir, args.job)
        print(json.dumps(scores) if args.format == "json" else format_comparison(scores))
        return 0
    from atoll.fl.simulator import simulate

    folders = prepare(args.data_dir)
    result = simulate(
        args.job,
        {site: {DATASET: str(folder)} for site, folder in folders.items()},
        on_event=_print_event,
    )
    print(f"results: {result.results_dir}")
    print(format_comparison(compare(result.results_dir, args.data_dir, args.job)))
    return 0


def _print_event(event: dict[str, Any]) -> None:
    if event.get("event") == "round":
        val = event.get("global", {}).get("validate", {})
        sites = ", ".join(
            f"{s} {m.get('validate', {}).get('accuracy', float('nan')):.3f}"
            for s, m in sorted(event.get("sites", {}).items())
        )
        print(
            f"round {event['round']}/{event['total_rounds']}: "
            f"validation accuracy {val.get('accuracy', float('nan')):.3f} ({sites})",
            flush=True,
        )
    elif event.get("event") == "cross_site_eval":
        print(event.get("text", ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
