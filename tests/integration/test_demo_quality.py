"""The hospitals demo learns: federated beats every hospital alone, and nearly matches pooling.

Same data (atoll.demo.data.prepare with its default seed), same job folder and settings as
`make demo`; the job runs in the in-process simulator instead of a TLS federation, which changes
how the bytes travel, not what is computed.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

importlib.import_module("torch")  # required: a process this test starts loads it
importlib.import_module("sklearn")  # required: a process this test starts loads it

from atoll.demo import data as demo_data  # noqa: E402
from atoll.fl.simulator import simulate  # noqa: E402

JOB = Path(__file__).resolve().parents[2] / "examples" / "hospitals"


def test_federated_beats_every_site_alone_and_is_within_two_points_of_centralized(tmp_path):
    folders = demo_data.prepare(tmp_path / "data")
    sites = {site: {demo_data.DATASET: str(folder)} for site, folder in folders.items()}
    result = simulate(JOB, sites, results_dir=tmp_path / "results")
    assert result.site_errors == {}

    scores = demo_data.compare(result.results_dir, tmp_path / "data", JOB)
    print(demo_data.format_comparison(scores))
    for site in demo_data.SITES:
        assert scores["federated"] > scores[site], f"{site} alone did as well: {scores}"
    assert scores["federated"] >= scores["centralized"] - 0.02, scores

    summary = json.loads((result.results_dir / "summary.json").read_text())
    assert summary["num_rounds"] == 10 and summary["dropped"] == {}
    assert set(summary["cross_site_eval"]["global_final"]) == set(demo_data.SITES)
    for name in (
        "global_model_final.safetensors",
        "global_model_best.safetensors",
        "metrics.csv",
        "metrics.jsonl",
        "training_curves.png",
    ):
        assert (result.results_dir / name).is_file(), name
    rounds = [e for e in result.events if e["event"] == "round"]
    assert len(rounds) == 10 and all(set(e["sites"]) == set(demo_data.SITES) for e in rounds)


def test_sites_hold_different_non_iid_slices(tmp_path):
    import numpy as np

    folders = demo_data.prepare(tmp_path / "data")
    for index, (site, folder) in enumerate(folders.items()):
        labels = np.load(folder / "train.npz")["y"]
        home = np.isin(labels, demo_data.HOME_DIGITS[index]).mean()
        assert home > 0.75, f"{site}: only {home:.0%} of its records are its home digits"
    test_x = [np.load(f / "test.npz")["x"] for f in folders.values()]
    assert all(np.array_equal(test_x[0], x) for x in test_x)  # one shared held-out split
