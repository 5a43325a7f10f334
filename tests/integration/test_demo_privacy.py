"""The hospitals demo's privacy variants, end to end over a real local federation (a server
and three hospital parents as processes, mutual TLS, the process launcher): secure aggregation
learns what plain FedAvg learns, and DP-FedAvg and DP-SGD report their epsilon and still
learn."""

from __future__ import annotations

import importlib

import pytest

importlib.import_module("torch")  # required: a process this test starts loads it
importlib.import_module("sklearn")  # required: a process this test starts loads it
importlib.import_module("opacus")  # required: a process this test starts loads it

from atoll.demo.privacy import DELTA, federate_variants, format_rows, variants  # noqa: E402
from atoll.fl.privacy.accounting import epsilon  # noqa: E402


def test_secure_aggregation_and_dp_fedavg_variants_run_and_report_accuracy_and_epsilon(tmp_path):
    chosen = {name: privacy for name, privacy in variants((0.1,), (1.0,)).items()
              if name != "fedavg"}
    rows = {r["variant"]: r for r in federate_variants(tmp_path / "demo", chosen)}
    print(format_rows(list(rows.values())))
    secure = rows["secagg"]
    assert secure["secure_aggregation"] and secure["epsilon"] is None
    assert secure["accuracy"] >= 0.93  # plain FedAvg's 95 %, as test_demo_quality asserts
    private = rows["dp-z0.1"]
    assert private["secure_aggregation"] and private["rounds"] == 10
    assert private["epsilon"] == pytest.approx(epsilon(0.1, 10, DELTA))
    assert private["accuracy"] >= 0.6  # noised: lower, yet far above chance (10 %)
    example_level = rows["dpsgd-z1"]  # DP-SGD through Opacus in each hospital's worker
    assert 1.0 < example_level["epsilon"] < 20.0  # Opacus's RDP epsilon, as the sites report it
    assert example_level["accuracy"] >= 0.8
