"""Issue 32, federated statistics: a job's own workflow class is the attacker. On a real local
federation (server and two site parents as processes, mutual TLS, workers in the process
launcher's sandbox) it asks one site's statistics with the 17-query differencing attack (bin
edges of its choosing, each count >= min_count), then with the site's own histogram and its
complements, repeated questions, other means and other min_counts. The site's rules must hold:
the attacker cannot place the target patient's value closer than the site's precision, no
released min or max is a record's value, no released cell is under min_count and no hidden one
comes back from the count. Before the defence the same workflow placed it within 0.001."""

from __future__ import annotations

import csv
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.integration.federation.harness import Federation

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
SITES = ["site-1", "site-2"]
MIN_COUNT, PRECISION = 5, 1.0
DP = {"epsilon": 1.0, "budget": 2.5}  # site-2: dp, two answers per job (no site ledger yet)
ATTACK = Path(__file__).with_name("stats_attack")


def _write(folder: Path, values: np.ndarray) -> None:
    folder.mkdir(parents=True)
    with open(folder / "cohort.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "x"])
        for i, value in enumerate(values):
            writer.writerow([i, f"{value:.6f}"])


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    values = {s: np.random.default_rng(i).uniform(20, 80, 60).round(6)
              for i, s in enumerate(SITES)}
    runtime = {}
    rules = {"site-1": f"{{min_count: {MIN_COUNT}}}",
             "site-2": f"{{min_count: {MIN_COUNT}, columns: {{x: {{bounds: [0, 100]}}}}, "
                       f"dp: {{epsilon: {DP['epsilon']}, budget: {DP['budget']}}}}}"}
    for site in SITES:
        _write(data / site, values[site])
        runtime[site] = ("format_version: 2\nstudies:\n  default:\n    datasets:\n"
                         f"      cohort: {{source: {data / site}, mode: ro}}\n"
                         f"    statistics: {rules[site]}\n")
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), SITES, USERS, runtime=runtime)
    fed.start_all()
    fed.wait_online(ADMIN)
    fed.values = values
    yield fed
    fed.stop_all()


def _attack(fed, tmp_path, target="site-1") -> dict:
    job = tmp_path / "attack"
    (job / "app").mkdir(parents=True)
    for name in ("attack.py", "site.py"):
        shutil.copy(ATTACK / name, job / "app" / name)
    (job / "app" / "app.yaml").write_text("server:\n  workflow: attack.py:Differencing\n"
                                          f"  args: {{target: {target}}}\n"
                                          "site:\n  script: site.py\n")
    (job / "meta.json").write_text(json.dumps({"name": "attack",
                                               "deploy_map": {"app": ["@ALL"]}}))
    with fed.session(ADMIN) as s:
        done = s.submit(job, wait=True, timeout=600)
        logs = s.logs(done["job_id"])["logs"] if done["state"] != "FINISHED:COMPLETED" else {}
        assert done["state"] == "FINISHED:COMPLETED", (done["reason"], logs)
        out = s.download(done["job_id"], tmp_path / "download")
    if out.is_file():
        with zipfile.ZipFile(out) as zf:
            zf.extractall(tmp_path / "results")
        out = tmp_path / "results"
    return json.loads(next(out.rglob("attack.json")).read_text())


def test_a_differencing_workflow_cannot_isolate_a_patient(fed, tmp_path):
    found = _attack(fed, tmp_path)
    values = np.sort(fed.values["site-1"])
    target = values[found["rank"]]
    low, high = found["interval"]
    assert low <= target < high  # the attacker's own reasoning is sound...
    assert high - low >= PRECISION  # ...and gets no closer than the site's precision
    assert not found["bisected"]
    # min and max: cell edges around the extremes, never a patient's value
    assert found["min"] <= values[0] < found["min"] + PRECISION
    assert found["max"] - PRECISION <= values[-1] < found["max"]
    assert found["min"] not in values and found["max"] not in values
    refusals = [e["meta"]["statistics"]["x"]["refused"] for e in found["log"]
                if "refused" in e["meta"].get("statistics", {}).get("x", {})]
    assert any("own grid only" in r for r in refusals)  # its edges
    assert any("statistics.max_queries" in r for r in refusals)  # its fourth spread
    assert [e["meta"]["refused"] for e in found["log"] if "refused" in e["meta"]] == [
        f"this job's statistics are answered with min_count {MIN_COUNT} (its first question); "
        f"a question with min_count {m} is refused" for m in (6, 7, 8)]
    histograms = [e["meta"]["statistics"]["x"] for e in found["log"]
                  if "histogram" in e["meta"].get("statistics", {}).get("x", {})]
    assert len(histograms) == 3 and histograms[1] == histograms[0]  # asked again: the same
    assert all(h["histogram"] == histograms[0]["histogram"] for h in histograms)  # fixed cells
    cells = histograms[0]["histogram"]
    assert all(c is None or c == 0 or c >= MIN_COUNT for c in cells)
    hidden = [i for i, c in enumerate(cells) if c is None]
    assert hidden  # 60 values over 60 unit cells: most are small
    complement = len(values) - sum(c for c in cells if c is not None)
    assert complement - (len(hidden) - 1) >= MIN_COUNT  # no hidden cell pinned by the count


def _histograms(found):
    return [e["meta"]["statistics"]["x"] for e in found["log"]
            if "histogram" in e["meta"].get("statistics", {}).get("x", {})]


def test_another_job_gets_the_same_answers_not_a_fresh_view(fed, tmp_path):
    first, second = (_attack(fed, tmp_path / str(i)) for i in (1, 2))
    assert _histograms(first)[0] == _histograms(second)[0]
    assert (first["min"], first["max"], first["count"]) == (
        second["min"], second["max"], second["count"])


def test_a_dp_site_answers_noisy_once_and_stops_at_its_budget(fed, tmp_path):
    found = _attack(fed, tmp_path, target="site-2")
    values = fed.values["site-2"]
    assert not found["bisected"]
    assert found["count"] != len(values)  # Laplace noise on the count
    summary = found["log"][0]["meta"]["statistics"]["x"]
    assert "min" not in summary and "max" not in summary and summary["bounds"] == [0.0, 100.0]
    spreads = _histograms(found)
    assert len(spreads) == 2 and spreads[0] == spreads[1]  # asked again: its first answer
    assert spreads[0]["first"] == 0 and len(spreads[0]["histogram"]) == 100  # the bounds' grid
    refusals = [e["meta"]["statistics"]["x"].get("refused", "") for e in found["log"]
                if "statistics" in e["meta"]]
    # summary and one spread spent 2 x 1.0 of 2.5: the next new answer is refused, naming whose
    assert any("budget" in r and "exhausted" in r for r in refusals)
