"""Experiment tracking with a real MLflow tracking server, started here, and a real federation.

The demo job (examples/hospitals) runs over mutual TLS with the process launcher. It asks in its
app.yaml for MLflow tracking (per job: the server worker streams the global metrics and a nested
run per site), and hospital-1's operator also sets MLFLOW_TRACKING_URI for the study in its
local/study_runtime.yaml (per site: that site's worker streams its own metrics). Both must show
up in MLflow while the job is still running, not at its end. hospital-2's operator keeps
TensorBoard event files instead, in a read-write dataset of the study (TENSORBOARD_LOGDIR).
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest
import yaml

importlib.import_module("torch")  # required: a process this test starts loads it
importlib.import_module("sklearn")  # required: a process this test starts loads it

from atoll.admin.session import Session  # noqa: E402
from atoll.demo import data as demo_data  # noqa: E402
from atoll.demo.run import RESEARCHER, STUDY, provision_demo  # noqa: E402
from atoll.parent import detach  # noqa: E402

EXPERIMENT = "hospitals-tracking"
SITE_EXPERIMENT = "hospital-1-own"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (SQLite backend) on a free local port, for this module."""
    port = _free_port()
    folder = tmp_path_factory.mktemp("mlflow")
    log = open(folder / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--default-artifact-root", str(folder / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, cwd=folder,
        start_new_session=True)  # its own process group: its uvicorn worker goes with it
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("mlflow server did not start:\n"
                                 + (folder / "server.log").read_text()[-3000:])
        time.sleep(0.5)
    yield uri
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(5)  # it shuts down gracefully for ~20 s: nothing of it is needed any more
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def _job(tmp_path: Path, uri: str) -> Path:
    job = tmp_path / "job"
    shutil.copytree(demo_data.JOB_DIR, job)
    app = job / "app" / "app.yaml"
    config = yaml.safe_load(app.read_text())
    config["server"]["args"]["num_rounds"] = 6
    config["server"]["tracking"] = {"mlflow": {"tracking_uri": uri, "experiment": EXPERIMENT}}
    app.write_text(yaml.safe_dump(config))
    return job


def _map_sites(project: Path, folders: dict[str, Path], uri: str, tensorboard: Path) -> None:
    for site, folder in folders.items():
        runtime = {"format_version": 2, "studies": {STUDY: {
            "datasets": {demo_data.DATASET: {"source": str(folder), "mode": "ro"}}}}}
        if site == "hospital-1":  # this site's operator tracks its own metrics
            runtime["studies"][STUDY]["env"] = {"MLFLOW_TRACKING_URI": uri,
                                                "MLFLOW_EXPERIMENT_NAME": SITE_EXPERIMENT}
        if site == "hospital-2":  # this one in TensorBoard, in a folder the job may write
            runtime["studies"][STUDY]["datasets"]["tensorboard"] = {"source": str(tensorboard),
                                                                    "mode": "rw"}
            runtime["studies"][STUDY]["env"] = {
                "TENSORBOARD_LOGDIR": f"/data/{STUDY}/tensorboard"}
        (project / site / "local" / "study_runtime.yaml").write_text(yaml.safe_dump(runtime))


def _allow_mlflow(project: Path, uri: str, parents: list[str]) -> None:
    """Workers have a network of their own: the operators of these parents allow their MLflow
    server (local/site.yaml's process.network.allow), which the worker reaches relayed."""
    destination = uri.removeprefix("http://")
    for name in parents:
        site_yaml = project / name / "local" / "site.yaml"
        site_yaml.write_text(site_yaml.read_text()
                             + f'\nprocess: {{network: {{allow: ["{destination}"]}}}}\n')


def _runs(client, experiment: str) -> dict[str, object]:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return {}
    return {run.info.run_name: run for run in client.search_runs([found.experiment_id])}


def test_the_demo_jobs_metrics_stream_to_a_real_mlflow_server_while_it_runs(tmp_path,
                                                                          mlflow_server):
    client = mlflow.MlflowClient(mlflow_server)
    folders = demo_data.prepare(tmp_path / "data")
    project = provision_demo(tmp_path / "kits", demo_data.SITES)
    tensorboard = tmp_path / "hospital-2-tensorboard"
    tensorboard.mkdir()
    _map_sites(project, folders, mlflow_server, tensorboard)
    _allow_mlflow(project, mlflow_server, ["server", "hospital-1"])
    parents = [("server", project / "server")] + [("site", project / s) for s in demo_data.SITES]
    detach.start_many([(role, kit, kit / "workspace") for role, kit in parents])
    try:
        with Session(project / RESEARCHER, study=STUDY) as session:
            deadline = time.monotonic() + 60
            while not all(s["online"] for s in session.sites()["sites"]):
                assert time.monotonic() < deadline, "sites did not come online"
                time.sleep(0.1)
            job_id = session.submit(_job(tmp_path, mlflow_server))["job_id"]

            # while the job runs: the job's run has global validation metrics, each site
            # a nested run with its own, and hospital-1 its own run in its own experiment
            deadline = time.monotonic() + 300
            while True:
                job = session.status(job_id)
                runs = _runs(client, EXPERIMENT)
                site_runs = _runs(client, SITE_EXPERIMENT)
                parent = next((r for name, r in runs.items() if job_id in name), None)
                if (parent is not None and "validate/accuracy" in parent.data.metrics
                        and set(demo_data.SITES) <= set(runs)
                        and any("train/loss" in r.data.metrics for r in site_runs.values())):
                    break
                assert not job["state"].startswith("FINISHED"), (
                    f"the job ended before its metrics reached MLflow: {job['state']} "
                    f"{job.get('reason')}; runs: {sorted(runs)}, site runs: {sorted(site_runs)}")
                assert time.monotonic() < deadline, "no metrics in MLflow after 300 s"
                time.sleep(0.5)
            assert not job["state"].startswith("FINISHED")  # seen live, not at the end
            assert parent.info.status == "RUNNING"
            for site in demo_data.SITES:
                assert runs[site].data.tags["mlflow.parentRunId"] == parent.info.run_id
                assert "validate/accuracy" in runs[site].data.metrics

            job = session.wait(job_id, timeout=240)
            assert job["state"] == "FINISHED:COMPLETED", job
            results = session.download(job_id, tmp_path / "results")
    finally:
        for role, kit in reversed(parents):
            detach.stop(kit / "workspace", role)

    runs = _runs(client, EXPERIMENT)
    parent = next(r for name, r in runs.items() if job_id in name)
    assert parent.info.status == "FINISHED"
    history = client.get_metric_history(parent.info.run_id, "validate/accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]  # rounds count from 1
    (own,) = _runs(client, SITE_EXPERIMENT).values()
    assert own.data.tags["atoll.site"] == "hospital-1" and own.data.tags["atoll.job_id"] == job_id
    assert own.info.status == "FINISHED"
    own_loss = client.get_metric_history(own.info.run_id, "train/loss")
    assert sorted(m.step for m in own_loss) == [1, 2, 3, 4, 5, 6]
    assert "local_loss" in own.data.metrics  # fl.log_metrics, streamed by the site itself

    _check_registered_model(client, mlflow_server, project, job_id, results, parent, tmp_path)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard / job_id / "hospital-2"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss/hospital-2")] == [1, 2, 3, 4, 5, 6]
    assert "local_loss/hospital-2" in events.Tags()["scalars"]  # fl.log_metrics too


def _check_registered_model(client, uri: str, project: Path, job_id: str, results: Path,
                            job_run, tmp_path: Path) -> None:
    """`atoll provenance register` (issue 38): the downloaded record and model, verified, make a
    model version of the job's run whose tags are the record's digests; the record and the
    model are the run's artifacts."""
    import hashlib
    import json

    record = results / "provenance.json"
    model = next(results.rglob("global_model_final.safetensors"))
    ca = project / RESEARCHER / "startup" / "rootCA.pem"
    done = subprocess.run(
        [sys.executable, "-m", "atoll", "provenance", "register", str(record), "--ca", str(ca),
         "--model", str(model), "--tracking-uri", uri, "--name", "hospitals-model",
         "--format", "json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["run_id"] == job_run.info.run_id  # the job's own tracked run
    version = client.get_model_version("hospitals-model", answer["version"])
    entries = [json.loads(e["entry"]) for e in json.loads(record.read_text())["entries"]]
    final = next(e["body"] for e in entries if e["kind"] == "job.final")
    signed = entries[0]["body"]
    assert version.run_id == job_run.info.run_id
    assert version.tags["atoll.job_id"] == job_id
    assert version.tags["atoll.model_digest"] == final["model_digest"] == (
        "sha256:" + hashlib.sha256(model.read_bytes()).hexdigest())
    assert version.tags["atoll.metrics_digest"] == final["metrics_digest"]
    assert version.tags["atoll.content_digest"] == signed["content_digest"]
    assert version.tags["atoll.statement_digest"] == signed["statement_digest"]
    assert version.tags["atoll.record_digest"] == (
        "sha256:" + hashlib.sha256(record.read_bytes()).hexdigest())
    assert version.tags["atoll.sites"] == ",".join(sorted(demo_data.SITES))
    fetched = Path(mlflow.artifacts.download_artifacts(
        run_id=job_run.info.run_id, artifact_path="atoll", tracking_uri=uri,
        dst_path=str(tmp_path / "fetched")))
    assert (fetched / "provenance.json").read_bytes() == record.read_bytes()
    assert (fetched / model.name).read_bytes() == model.read_bytes()
    # a model that is not the record's is refused before anything reaches MLflow
    other = tmp_path / "other.safetensors"
    other.write_bytes(model.read_bytes()[:-1] + bytes([model.read_bytes()[-1] ^ 1]))
    refused = subprocess.run(
        [sys.executable, "-m", "atoll", "provenance", "register", str(record), "--ca", str(ca),
         "--model", str(other), "--tracking-uri", uri, "--name", "hospitals-model"],
        capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "job.final" in refused.stderr, refused.stderr
    assert len(client.search_model_versions("name = 'hospitals-model'")) == 1


CRASHING_SITE = """
import numpy as np
import atoll.client as fl
fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.site_name() == "b" and model.current_round == 2:
        raise RuntimeError("disk full")
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 0.5}, num_examples=1))
        continue
    fl.send(fl.Model(params={"w": np.ones(2)}, num_examples=1, metrics={"loss": 1.0}))
"""


def _simulated_job(tmp_path: Path, uri: str, experiment: str) -> Path:
    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    (job / "meta.json").write_text('{"name": "crash", "deploy_map": {"app": ["@ALL"]}}')
    (job / "app" / "app.yaml").write_text(yaml.safe_dump({
        "server": {"workflow": "fedavg", "args": {"num_rounds": 3, "min_clients": 2},
                   "tracking": {"mlflow": {"tracking_uri": uri, "experiment": experiment}}},
        "site": {"script": "train.py"}}))
    (job / "app" / "train.py").write_text(CRASHING_SITE)
    return job


def test_a_failed_job_ends_its_runs_as_failed(tmp_path, mlflow_server):
    from atoll.fl.simulator import simulate

    simulate(_simulated_job(tmp_path, mlflow_server, "crashing"), {"a": {}, "b": {}},
             results_dir=tmp_path / "out", raise_on_error=False)
    runs = _runs(mlflow.MlflowClient(mlflow_server), "crashing")
    assert set(runs) >= {"a", "b"} and len(runs) == 3
    assert {run.info.status for run in runs.values()} == {"FAILED"}
    parent = next(run for name, run in runs.items() if name not in ("a", "b"))
    assert [m.step for m in mlflow.MlflowClient(mlflow_server).get_metric_history(
        parent.info.run_id, "validate/accuracy")] == [1]  # round 1 made it before the crash


def test_an_unreachable_tracking_server_costs_a_warning_not_the_job(tmp_path, caplog):
    from atoll.fl.simulator import simulate

    job = _simulated_job(tmp_path, f"http://127.0.0.1:{_free_port()}", "nowhere")
    (job / "app" / "train.py").write_text(CRASHING_SITE.replace('"b"', '"nobody"'))
    result = simulate(job, {"a": {}, "b": {}}, results_dir=tmp_path / "out")
    assert result.site_errors == {}
    assert (tmp_path / "out" / "summary.json").is_file()
    assert "MLflow tracking to http://127.0.0.1:" in caplog.text and "is off" in caplog.text
