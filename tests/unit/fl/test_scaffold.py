"""examples/scaffold: the job's server and site updates equal a reference written here, on its
own, from the paper (Karimireddy et al. 2020, Algorithm 1, option II), on random data."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import yaml

from atoll.fl.serde import load_file
from atoll.fl.simulator import simulate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "scaffold"
SITES = ("site-a", "site-b", "site-c")
ROUNDS, STEPS, LR, SERVER_LR = 3, 4, 0.5, 0.7


def _data(tmp_path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(42)
    data = {}
    for index, site in enumerate(SITES):
        n = 30 + 10 * index
        x = rng.normal(size=(n, 64))
        y = (rng.integers(0, 3, size=n) + 3 * index) % 10  # each site its own few classes
        folder = tmp_path / "data" / site
        folder.mkdir(parents=True)
        np.savez(folder / "train.npz", x=x, y=y)
        np.savez(folder / "val.npz", x=x[:5], y=y[:5])
        data[site] = (x, y)
    return data


def _reference_gradient(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mean cross-entropy of softmax(x W + b), theta = [W.ravel(), b], written from scratch."""
    w, b = theta[:640].reshape(64, 10), theta[640:]
    z = x @ w + b
    z = z - z.max(axis=1)[:, None]
    softmax = np.exp(z) / np.exp(z).sum(axis=1)[:, None]
    onehot = np.eye(10)[y]
    residual = (softmax - onehot) / len(y)
    return np.concatenate([(x.T @ residual).ravel(), residual.sum(axis=0)])


def _reference(data) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    x_global, c_global = np.zeros(650), np.zeros(650)
    c_local = {site: np.zeros(650) for site in SITES}
    for _ in range(ROUNDS):
        dys, dcs = [], []
        for site in SITES:
            y_local = x_global.copy()
            for _ in range(STEPS):
                g = _reference_gradient(y_local, *data[site])
                y_local = y_local - LR * (g - c_local[site] + c_global)
            c_plus = c_local[site] - c_global + (x_global - y_local) / (STEPS * LR)
            dys.append(y_local - x_global)
            dcs.append(c_plus - c_local[site])
            c_local[site] = c_plus
        x_global = x_global + SERVER_LR * sum(dys) / len(dys)
        c_global = c_global + (len(dcs) / len(SITES)) * sum(dcs) / len(dcs)
    return x_global, c_global, c_local


def test_the_job_matches_the_reference(tmp_path):
    data = _data(tmp_path)
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job, ignore=shutil.ignore_patterns("__pycache__"))
    app = yaml.safe_load((job / "app" / "app.yaml").read_text())
    app["server"]["args"].update(num_rounds=ROUNDS, server_lr=SERVER_LR)
    app["site"]["config"].update(local_steps=STEPS, lr=LR, batch_size=0)  # full batch
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(app))
    sites = {site: {"records": str(tmp_path / "data" / site)} for site in SITES}
    result = simulate(job, sites, results_dir=tmp_path / "results")
    assert result.site_errors == {}

    x_ref, c_ref, c_local = _reference(data)
    x = load_file(tmp_path / "results" / "global_model_final.safetensors").params
    c = load_file(tmp_path / "results" / "control_variate_final.safetensors").params
    np.testing.assert_allclose(np.concatenate([x["w"].ravel(), x["b"]]), x_ref, rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(np.concatenate([c["w"].ravel(), c["b"]]), c_ref, rtol=1e-9,
                               atol=1e-12)
    # with every site in every round, the server's c is the mean of the sites' own c_i
    np.testing.assert_allclose(c_ref, sum(c_local.values()) / len(SITES), atol=1e-12)
    assert np.abs(c_ref).max() > 1e-3  # the control variates did something
    rounds = [e for e in result.events if e.get("event") == "round"]
    assert len(rounds) == ROUNDS and all("accuracy" in e["metrics"] for e in rounds)


def test_the_readme_comparison_with_fedavg(tmp_path):
    """compare.py as the README reports it: on the hospitals SCAFFOLD leads FedAvg early and
    both end near 90 % (the numbers are deterministic: seeded data and batches)."""
    import importlib.util


    importlib.import_module("sklearn")  # required: a process this test starts loads it
    from atoll.demo.data import prepare

    spec = importlib.util.spec_from_file_location("scaffold_compare", EXAMPLE / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    prepare(tmp_path / "data")
    scores = compare.compare(tmp_path / "data", tmp_path)
    print(scores)
    scaffold, fedavg = scores["scaffold"], scores["fedavg"]
    assert len(scaffold["validation"]) == len(fedavg["validation"]) == 10
    assert scaffold["validation"][0] > fedavg["validation"][0]
    assert scaffold["validation"][1] > fedavg["validation"][1] + 0.05  # 88.5 % against 81.4 %
    assert scaffold["test"] > 0.85 and fedavg["test"] > 0.85
