"""The poisoned clinic's effect under each aggregator: the job as it is, with aggregator set to
weighted_mean, median and trimmed_mean in turn, and with no attacker, in the simulator.

    python examples/robust/compare.py [DATA_DIR]
"""

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("robust_make_data", HERE / "make_data.py")
_make_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_make_data)
SITES, write_clinics = _make_data.SITES, _make_data.write_clinics


def variant(work: Path, name: str, aggregator: str, attacker: bool) -> Path:
    job = work / f"job-{name}"
    shutil.copytree(HERE, job, ignore=shutil.ignore_patterns("__pycache__", "*.md", "*.py"))
    shutil.copy(HERE / "app" / "train.py", job / "app" / "train.py")
    shutil.copy(HERE / "app" / "model.py", job / "app" / "model.py")
    app = yaml.safe_load((job / "app" / "app.yaml").read_text())
    app["server"]["args"]["aggregator"] = aggregator
    if not attacker:
        app["site"]["config"]["poisoned_site"] = "nobody"
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(app))
    return job


def test_accuracy(results: Path, data_dir: Path) -> float:
    from atoll.fl.serde import load_file

    params = load_file(results / "global_model_final.safetensors").params
    with np.load(data_dir / SITES[0] / "test.npz") as test:
        logits = test["x"] @ params["w"] + params["b"]
        return float(np.mean(logits.argmax(axis=1) == test["y"]))


RUNS = {  # name -> (aggregator, with the attacker)
    "weighted_mean, no attacker": ("weighted_mean", False),
    "weighted_mean": ("weighted_mean", True),
    "median": ("median", True),
    "trimmed_mean": ("trimmed_mean", True),
}


def compare(data_dir: Path, work: Path) -> dict[str, float]:
    from atoll.fl.simulator import simulate

    sites = {site: {"records": str(data_dir / site)} for site in SITES}
    scores = {}
    for index, (name, (aggregator, attacker)) in enumerate(RUNS.items()):
        results = work / f"results-{index}"
        simulate(variant(work, str(index), aggregator, attacker), sites, results_dir=results)
        scores[name] = test_accuracy(results, data_dir)
    return scores


if __name__ == "__main__":
    work = Path(tempfile.mkdtemp(prefix="robust-compare-"))
    data_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else work / "data"
    if not (data_dir / SITES[0] / "train.npz").exists():
        write_clinics(data_dir)
    for name, accuracy in compare(data_dir, work).items():
        print(f"{name:<28} {100 * accuracy:6.2f} %")
