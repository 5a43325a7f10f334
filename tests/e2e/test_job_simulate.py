"""`atoll job simulate`: the simulator on the command line, on every `job init` template and on
the demo job, with the live progress of `submit --wait` and the results folder of `download`."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from tests.e2e.newcomer import cli  # noqa: F401 - the fixture


def _results(out):
    [folder] = list(out.iterdir())
    job = json.loads((folder / "job.json").read_text())
    return folder, job


@pytest.mark.parametrize("workflow,framework", [
    ("fedavg", "numpy"), ("fedopt", "numpy"), ("fedprox", "numpy"),
    ("scatter_gather", "numpy"), ("fedavg", "torch")])
def test_every_template_simulates(cli, workflow, framework):  # noqa: F811
    if framework == "torch":
        importlib.import_module("torch")  # required: a process this test starts loads it
    cli("job", "init", "myjob", "--workflow", workflow, "--framework", framework)
    ran = cli("job", "simulate", "myjob", "--set", "num_rounds=2", "--out", "out")
    assert "round 1:" in ran.stdout and "round 2:" in ran.stdout and "round 3:" not in ran.stdout
    folder, job = _results(cli.cwd / "out")
    assert job["state"] == "FINISHED:COMPLETED" and job["simulated"]
    assert (folder / "results").is_dir() and any((folder / "results").iterdir())
    assert f"results in {folder}" in ran.stdout


@pytest.mark.parametrize("workflow,framework", [
    ("scaffold", "numpy"), ("cyclic", "numpy"), ("stats", "numpy"), ("custom", "numpy"),
    ("fedavg", "torch-ddp")])
def test_the_templates_of_shipped_workflows_simulate(cli, workflow, framework):  # noqa: F811
    """The workflows a job ships (issue 26) and the DDP template (issue 23) run as written."""
    if framework == "torch-ddp":
        importlib.import_module("torch")  # required: a process this test starts loads it
    cli("job", "init", "myjob", "--workflow", workflow, "--framework", framework)
    ran = cli("job", "simulate", "myjob", "--out", "out")
    assert "round 0" not in ran.stdout  # rounds count from 1 wherever users see them
    _, job = _results(cli.cwd / "out")
    assert job["state"] == "FINISHED:COMPLETED" and job["simulated"], ran.stdout


def test_the_demo_job_simulates_with_each_sites_data_and_live_progress(cli, tmp_path):  # noqa: F811
    from atoll.demo.data import JOB_DIR, SITES

    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "atoll.demo.data", "prepare", str(data)], check=True,
                   capture_output=True, timeout=300)
    sites = [a for s in SITES for a in ("--site", f"{s}={data / s}")]
    proc = cli.popen("job", "simulate", str(JOB_DIR), *sites, "--dataset", "records",
                     "--set", "num_rounds=3", "--out", "out")
    first_round = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("  round 1:"):
            first_round = line
            still_running = proc.poll() is None  # printed as it happened, not at the end
    proc.wait(timeout=240)
    assert proc.returncode == 0, "".join(lines) + proc.stderr.read()
    assert first_round is not None and still_running
    assert "accuracy=" in first_round and "hospital-3/accuracy=" in first_round
    folder, job = _results(cli.cwd / "out")
    assert job["state"] == "FINISHED:COMPLETED"
    assert len((folder / "results" / "metrics.csv").read_text().splitlines()) > 1


def test_simulate_checks_the_job_first_and_reports_each_sites_failure(cli):  # noqa: F811
    cli("job", "init", "myjob")
    bad = cli("job", "simulate", "myjob", "--set", "num_round=2", check=False)
    assert bad.returncode == 2
    assert "--set: server.args.num_round: unknown key" in bad.stderr
    meta = cli.cwd / "myjob" / "meta.json"  # not logged in: job init left min_clients out
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "min_clients": 2}))
    few = cli("job", "simulate", "myjob", "--sites", "1", check=False)
    assert few.returncode == 2 and "min_clients: 2, but the job can reach only 1" in few.stderr
    (cli.cwd / "myjob" / "app" / "train.py").write_text(
        "import atoll.client as fl\nfl.init()\nraise RuntimeError(f'no data at {fl.site_name()}')\n")
    failed = cli("job", "simulate", "myjob", "--out", "out", check=False)
    assert failed.returncode == 1
    for site in ("site-1", "site-2"):
        assert failed.stdout.count(f"RuntimeError: no data at {site}") == 1
    _, job = _results(cli.cwd / "out")
    assert job["state"] == "FINISHED:FAILED"
