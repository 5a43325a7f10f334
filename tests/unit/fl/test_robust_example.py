"""examples/robust: one poisoned clinic of five wrecks the weighted mean, not the median or the
trimmed mean (each run in the simulator, scored on the shared held-out test split)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "robust"


def test_the_robust_aggregators_resist_the_poisoned_clinic(tmp_path):
    importlib.import_module("sklearn")  # required: a process this test starts loads it
    spec = importlib.util.spec_from_file_location("robust_compare", EXAMPLE / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    compare.write_clinics(tmp_path / "data")
    scores = compare.compare(tmp_path / "data", tmp_path)
    print(scores)
    assert scores["weighted_mean, no attacker"] > 0.8
    assert scores["weighted_mean"] < 0.5
    assert scores["median"] > 0.8 and scores["trimmed_mean"] > 0.8
