"""A FLARE job folder, written as FLARE's docs show it (the FedAvg recipe's export of hello-pt:
meta.json, app_server with the FedAvg workflow and a PyTorch persistor, one app per site with a
ClientAPIExecutor and the Client API script in custom/), translated with
``atoll job import-flare`` and run to completion on a local atoll federation: a server and two
sites as separate processes over mutual TLS, the sites' workers in the process launcher.

The script's only change is its import line (import-flare rewrites it; the fixture keeps
``import nvflare.client as flare``). Its data is synthetic (the docs' FakeData, without
torchvision): the test machine downloads nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.integration.federation.conftest import ADMIN, federation  # noqa: F401 (fixture)

FLARE_JOB = Path(__file__).parent / "flare_jobs" / "hello-pt"


def test_imported_flare_job_runs_to_completion(federation, tmp_path):  # noqa: F811
    out = tmp_path / "hello-pt-atoll"
    done = subprocess.run(
        [sys.executable, "-m", "atoll", "job", "import-flare", str(FLARE_JOB), str(out)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    original = (FLARE_JOB / "app_site-1" / "custom" / "client.py").read_text().splitlines()
    imported = (out / "app_site-1" / "client.py").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, imported, strict=True) if a != b]
    assert changed == [("import nvflare.client as flare",
                        "import atoll.compat.flare_client as flare")]

    with federation.session(ADMIN) as s:
        job = s.submit(out, wait=True, timeout=240)
        status = s.status(job["job_id"])
    assert status["state"] == "FINISHED:COMPLETED", status
    assert {name: part["state"] for name, part in status["parts"].items()} == {
        name: "FINISHED:COMPLETED" for name in ("server", "site-1", "site-2")}
    rounds = [e for e in status["progress"] if e.get("event") == "round"]
    assert [e["round"] for e in rounds] == [1, 2]  # the FLARE job's num_rounds: 2 (atoll counts from 1)
    for event in rounds:  # weighed by meta NUM_STEPS_CURRENT_ROUND: 64 samples / 16 per batch
        assert {site: r["num_examples"] for site, r in event["sites"].items()} == {
            "site-1": 4, "site-2": 4}
        assert set(event["sites"]["site-1"]["train"]) == {"accuracy"}


def test_flare_meta_spellings_and_cross_site_eval(federation, tmp_path):  # noqa: F811
    """The same job with its meta.json in FLARE's other spellings ({targets}/{sites} forms,
    min_clients as text, the legacy nested resource_spec): the submitter's check, the server's
    intake and each site's comparison of the dispatched meta with the signed one all read it
    the same way. With the recipe's cross-site evaluation (FLARE's CrossSiteModelEval), the
    script's flare.is_evaluate() branch answers every site's model."""
    flare_job = Path(shutil.copytree(FLARE_JOB, tmp_path / "hello-pt"))
    config = flare_job / "app_server" / "config" / "config_fed_server.json"
    server = json.loads(config.read_text())
    server["workflows"].append({
        "id": "cross_site_validate",
        "path": "nvflare.app_common.workflows.cross_site_model_eval.CrossSiteModelEval",
        "args": {"model_locator_id": "locator"}})
    config.write_text(json.dumps(server))
    out = tmp_path / "hello-pt-atoll"
    subprocess.run([sys.executable, "-m", "atoll", "job", "import-flare", str(flare_job),
                    str(out)], check=True, capture_output=True, timeout=120)
    meta = {
        "name": "hello-pt-spellings",
        "deploy_map": {"app_server": {"targets": ["server"]},
                       "app_site-1": [{"sites": ["site-1"]}], "app_site-2": "site-2"},
        "min_clients": "2",
        "resource_spec": {"site-1": {"process": {"num_of_gpus": 0},
                                     "docker": {"shm_size": "1g"}}},
    }
    (out / "meta.json").write_text(json.dumps(meta))
    with federation.session(ADMIN) as s:
        job = s.submit(out, wait=True, timeout=240)
        status = s.status(job["job_id"])
    assert status["state"] == "FINISHED:COMPLETED", status
    assert status["deploy_map"] == {"app_server": ["server"], "app_site-1": ["site-1"],
                                    "app_site-2": ["site-2"]}
    cross = next(e for e in status["progress"] if e.get("event") == "cross_site_eval")
    assert cross["failures"] == {}
    for model in ("global_final", "site-1", "site-2"):  # each model, evaluated at each site
        assert set(cross["table"][model]) == {"site-1", "site-2"}
        assert all(set(m) == {"accuracy"} for m in cross["table"][model].values())


def test_flare_recipe_export_of_hello_numpy_cse_runs_on_a_federation(federation, tmp_path):  # noqa: F811
    """The job FLARE 2.9's NumpyFedAvgRecipe + add_cross_site_evaluation exported
    (flare_jobs/hello-numpy-cse, one app deployed to @ALL): the NumPy persistor's array is the
    first round's model, and the script answers cross-site evaluation's validate tasks."""
    source = Path(__file__).parent / "flare_jobs" / "hello-numpy-cse"
    out = tmp_path / "hello-numpy-cse-atoll"
    subprocess.run([sys.executable, "-m", "atoll", "job", "import-flare", str(source),
                    str(out)], check=True, capture_output=True, timeout=120)
    with federation.session(ADMIN) as s:
        job = s.submit(out, wait=True, timeout=240)
        status = s.status(job["job_id"])
    assert status["state"] == "FINISHED:COMPLETED", status
    rounds = [e for e in status["progress"] if e.get("event") == "round"]
    assert [e["round"] for e in rounds] == [1, 2]
    # zeros from the persistor, one step up per round
    assert [e["sites"]["site-1"]["train"]["weight_mean"] for e in rounds] == [1.0, 2.0]
    cross = next(e for e in status["progress"] if e.get("event") == "cross_site_eval")
    assert cross["failures"] == {}
    for model in ("global_final", "site-1", "site-2"):
        assert cross["table"][model] == {"site-1": {"weight_mean": 2.0},
                                         "site-2": {"weight_mean": 2.0}}


def test_flare_recipe_exports_with_tracking_run_on_a_federation(federation, tmp_path):  # noqa: F811
    """hello-numpy (NumpyFedAvgRecipe, TensorBoard tracking) and hello-pt-recipe (PyTorch
    FedAvgRecipe, tracking, cross-site evaluation) as FLARE 2.9 exported them: the scripts'
    SummaryWriter values reach the job's status through real site workers."""
    jobs = Path(__file__).parent / "flare_jobs"
    for name, rounds in (("hello-numpy", 3), ("hello-pt-recipe", 2)):
        out = tmp_path / f"{name}-atoll"
        subprocess.run([sys.executable, "-m", "atoll", "job", "import-flare", str(jobs / name),
                        str(out)], check=True, capture_output=True, timeout=120)
        with federation.session(ADMIN) as s:
            job = s.submit(out, wait=True, timeout=240)
            status = s.status(job["job_id"])
        assert status["state"] == "FINISHED:COMPLETED", (name, status)
        assert [e["round"] for e in status["progress"] if e.get("event") == "round"] == list(
            range(1, rounds + 1))
        logged = [e for e in status["progress"] if e.get("event") == "site_metrics"]
        tag = "weight_mean" if name == "hello-numpy" else "train_loss"
        assert sorted((e["site"], e["step"]) for e in logged if tag in e["metrics"]) == [
            (site, step) for site in ("site-1", "site-2") for step in range(rounds)], name


def test_flare_recipe_export_of_hello_lightning_runs_on_a_federation(federation, tmp_path):  # noqa: F811
    """hello-lightning as FLARE 2.9's PyTorch FedAvgRecipe exported it (flare_jobs/): the
    script's ``flare.patch(trainer)`` federates its Lightning Trainer through real workers,
    round one from the persistor's LitNet."""
    source = Path(__file__).parent / "flare_jobs" / "hello-lightning"
    out = tmp_path / "hello-lightning-atoll"
    subprocess.run([sys.executable, "-m", "atoll", "job", "import-flare", str(source),
                    str(out)], check=True, capture_output=True, timeout=120)
    with federation.session(ADMIN) as s:
        job = s.submit(out, wait=True, timeout=300)
        status = s.status(job["job_id"])
    assert status["state"] == "FINISHED:COMPLETED", status
    rounds = [e for e in status["progress"] if e.get("event") == "round"]
    assert [e["round"] for e in rounds] == [1, 2]
    assert all("val_acc_epoch" in e["sites"][site]["train"]
               for e in rounds for site in ("site-1", "site-2"))


def test_flare_recipe_export_of_hello_huggingface_runs_on_a_federation(federation, tmp_path):  # noqa: F811
    """hello-huggingface as FLARE 2.9's PyTorch FedAvgRecipe exported it (flare_jobs/): the
    script's ``flare.patch(trainer)`` federates its Hugging Face Trainer through real workers,
    round one from the persistor's TinyGPT2, each result weighed by its steps' examples."""
    source = Path(__file__).parent / "flare_jobs" / "hello-huggingface"
    out = tmp_path / "hello-huggingface-atoll"
    subprocess.run([sys.executable, "-m", "atoll", "job", "import-flare", str(source),
                    str(out)], check=True, capture_output=True, timeout=120)
    with federation.session(ADMIN) as s:
        job = s.submit(out, wait=True, timeout=300)
        status = s.status(job["job_id"])
    assert status["state"] == "FINISHED:COMPLETED", status
    rounds = [e for e in status["progress"] if e.get("event") == "round"]
    assert [e["round"] for e in rounds] == [1, 2]
    for event in rounds:  # 8 steps of 16 sequences at each site
        assert {site: r["num_examples"] for site, r in event["sites"].items()} == {
            "site-1": 128, "site-2": 128}
        assert all("eval_loss" in event["sites"][site]["train"] for site in ("site-1", "site-2"))


def test_flare_recipe_export_of_hello_tabular_stats_runs_on_a_federation(federation, tmp_path):  # noqa: F811
    """hello-tabular-stats as FLARE 2.9's FedStatsRecipe exported it (an app per site), imported
    with the columns to ask about: each site's worker serves the user's DFStatisticsCore
    generator through atoll's statistics under the site's own rules."""
    source = Path(__file__).parent / "flare_jobs" / "hello-tabular-stats"
    out = tmp_path / "hello-tabular-stats-atoll"
    columns = ("train/Age", "test/Hours per week")
    subprocess.run([sys.executable, "-m", "atoll", "job", "import-flare", str(source), str(out),
                    *[a for c in columns for a in ("--column", c)]],
                   check=True, capture_output=True, timeout=120)
    with federation.session(ADMIN) as s:
        job = s.submit(out, wait=True, timeout=300)
        status = s.status(job["job_id"])
    assert status["state"] == "FINISHED:COMPLETED", status
    assert {name: part["state"] for name, part in status["parts"].items()} == {
        name: "FINISHED:COMPLETED" for name in ("server", "site-1", "site-2")}
    event = next(e for e in status["progress"] if e.get("event") == "statistics")
    assert event["columns"] == list(columns)  # both released: every site's count is >= 10
