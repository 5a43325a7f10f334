"""SCAFFOLD against FedAvg on the demo's non-IID hospitals: same data, same local SGD, same rounds.

    python examples/scaffold/compare.py [DATA_DIR]

Runs this job and a copy of it with the built-in fedavg workflow (the site script then trains
without control variates) in the simulator, and prints the global model's validation accuracy
per round (each hospital's own validation split, weighted by its size) and the final model's
accuracy on the shared held-out test split.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
SITES = ("hospital-1", "hospital-2", "hospital-3")


def fedavg_copy(out: Path) -> Path:
    """This job with the built-in fedavg instead of SCAFFOLD."""
    shutil.copytree(HERE, out, ignore=shutil.ignore_patterns("__pycache__", "*.md", "compare.py"))
    app = yaml.safe_load((HERE / "app" / "app.yaml").read_text())
    rounds = app["server"]["args"]["num_rounds"]
    app["server"] = {"workflow": "fedavg", "args": {"num_rounds": rounds, "evaluate_every": 1,
                                                    "cross_site_eval": "none"}}
    (out / "app" / "app.yaml").write_text(yaml.safe_dump(app))
    return out


def validation_curve(results: Path) -> list[float]:
    curve = {}
    for line in (results / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["phase"] == "validate" and record["site"] == "global":
            curve[record["round"]] = record["metrics"]["accuracy"]
    return [curve[r] for r in sorted(curve)]


def test_accuracy(results: Path, data_dir: Path) -> float:
    import importlib.util

    from atoll.fl.serde import load_file

    spec = importlib.util.spec_from_file_location("scaffold_model", HERE / "app" / "scaffold.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    evaluate = model.evaluate

    params = load_file(results / "global_model_final.safetensors").params
    with np.load(data_dir / SITES[0] / "test.npz") as test:
        return evaluate({k: params[k].astype(np.float64) for k in ("w", "b")},
                        test["x"].astype(np.float64), test["y"])["accuracy"]


def compare(data_dir: Path, work: Path) -> dict[str, dict]:
    from atoll.fl.simulator import simulate

    sites = {site: {"records": str(data_dir / site)} for site in SITES}
    scores = {}
    for name, job in (("scaffold", HERE), ("fedavg", fedavg_copy(work / "fedavg-job"))):
        result = simulate(job, sites, results_dir=work / name)
        if result.site_errors:
            raise RuntimeError(result.site_errors)
        scores[name] = {"validation": validation_curve(work / name),
                        "test": test_accuracy(work / name, data_dir)}
    return scores


def main() -> None:
    from atoll.demo.data import prepare

    work = Path(tempfile.mkdtemp(prefix="scaffold-compare-"))
    data_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else work / "data"
    if not (data_dir / SITES[0] / "train.npz").exists():
        prepare(data_dir)
    scores = compare(data_dir, work)
    print("round  " + "  ".join(f"{name:>9}" for name in scores))
    for round_ in range(len(scores["scaffold"]["validation"])):
        print(f"{round_ + 1:>5}  " + "  ".join(
            f"{100 * s['validation'][round_]:8.2f}%" for s in scores.values()))
    print("test   " + "  ".join(f"{100 * s['test']:8.2f}%" for s in scores.values()))


if __name__ == "__main__":
    main()
