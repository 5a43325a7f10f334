"""The workflow examples on a real local federation: a server and three hospital parents as
processes over mutual TLS, workers started by the process launcher in its sandbox, each hospital
mapping its data (the demo's digits, a cohort CSV) as study datasets, hospital-3 setting its own
statistics rules in its local/study_runtime.yaml."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from atoll.fl.serde import load_file
from tests.integration.federation.harness import Federation

importlib.import_module("sklearn")  # required: a process this test starts loads it

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
SITES = ["hospital-1", "hospital-2", "hospital-3"]


def _runtime(data: Path, site: str) -> str:
    rules = "    statistics: {min_count: 15}\n" if site == "hospital-3" else ""
    return ("format_version: 2\nstudies:\n  default:\n    datasets:\n"
            f"      records: {{source: {data / 'digits' / site}, mode: ro}}\n"
            f"      cohort: {{source: {data / 'cohorts' / site}, mode: ro}}\n" + rules)


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    from atoll.demo.data import prepare

    data = tmp_path_factory.mktemp("data")
    prepare(data / "digits")
    spec = importlib.util.spec_from_file_location("cohorts", EXAMPLES / "statistics" /
                                                  "make_data.py")
    cohorts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cohorts)
    cohorts.write_cohorts(data / "cohorts")
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), SITES, USERS,
                                 runtime={s: _runtime(data, s) for s in SITES})
    fed.start_all()
    fed.wait_online(ADMIN)
    fed.data = data
    yield fed
    fed.stop_all()


def _job(tmp_path: Path, name: str, server_args=None, site_config=None) -> Path:
    job = tmp_path / name
    shutil.copytree(EXAMPLES / name, job,
                    ignore=shutil.ignore_patterns("__pycache__", "*.md", "compare.py",
                                                  "make_data.py"))
    app = yaml.safe_load((job / "app" / "app.yaml").read_text())
    app["server"]["args"].update(server_args or {})
    app["site"].setdefault("config", {}).update(site_config or {})
    (job / "app" / "app.yaml").write_text(yaml.safe_dump(app))
    return job


def _run(fed, job: Path, tmp_path: Path) -> Path:
    with fed.session(ADMIN) as s:
        done = s.submit(job, wait=True, timeout=240)  # under the test's own 300 s
        logs = s.logs(done["job_id"])["logs"] if done["state"] != "FINISHED:COMPLETED" else {}
        assert done["state"] == "FINISHED:COMPLETED", (done["reason"], done["parts"], logs)
        out = s.download(done["job_id"], tmp_path / "download")
    return out


def _test_accuracy(fed, params) -> float:
    with np.load(fed.data / "digits" / "hospital-1" / "test.npz") as test:
        logits = test["x"] @ params["w"] + params["b"]
        return float(np.mean(logits.argmax(axis=1) == test["y"]))


def test_statistics_with_a_sites_own_rules(fed, tmp_path):
    out = _run(fed, _job(tmp_path, "statistics"), tmp_path)
    result = json.loads(next(out.rglob("statistics.json")).read_text())
    assert result["rules"]["hospital-3"]["min_count"] == 15  # its local/ file
    assert result["rules"]["hospital-1"]["min_count"] == 10  # the default
    ages = []
    for site in SITES:
        table = np.genfromtxt(fed.data / "cohorts" / site / "cohort.csv", delimiter=",",
                              names=True, dtype=None, encoding="utf-8")
        ages.append(np.asarray(table["age"], dtype=np.float64))
    pooled = np.concatenate(ages)
    age = result["columns"]["age"]["global"]
    assert abs(age["mean"] - pooled.mean()) <= 1e-9
    assert abs(age["variance"] - pooled.var(ddof=1)) <= 1e-9
    assert next(out.rglob("histograms.png")).stat().st_size > 1000


def test_scaffold(fed, tmp_path):
    out = _run(fed, _job(tmp_path, "scaffold", {"num_rounds": 3}), tmp_path)
    params = load_file(next(out.rglob("global_model_final.safetensors"))).params
    assert _test_accuracy(fed, params) > 0.8
    assert np.abs(load_file(next(out.rglob("control_variate_final.safetensors"))).params["w"]
                  ).max() > 0


def test_cyclic(fed, tmp_path):
    order = ["hospital-3", "hospital-1", "hospital-2"]
    out = _run(fed, _job(tmp_path, "cyclic", {"num_cycles": 2, "order": order}), tmp_path)
    visits = json.loads(next(out.rglob("cyclic.json")).read_text())["visits"]
    assert [v["site"] for v in visits] == order * 2
    assert all("metrics" in v for v in visits)


def test_robust_aggregation_with_a_poisoned_hospital(fed, tmp_path):
    """hospital-3 poisons every update: the median keeps what hospitals 1 and 2 learned (they
    rarely see digits 7-9, which hospital-3 holds), the weighted mean is wrecked."""
    scores = {}
    for aggregator in ("median", "weighted_mean"):
        job = _job(tmp_path / aggregator, "robust", {"num_rounds": 4, "aggregator": aggregator},
                   {"poisoned_site": "hospital-3"})
        meta = json.loads((job / "meta.json").read_text())
        (job / "meta.json").write_text(json.dumps({**meta, "min_clients": 3}))
        out = _run(fed, job, tmp_path / aggregator)
        params = load_file(next(out.rglob("global_model_final.safetensors"))).params
        scores[aggregator] = _test_accuracy(fed, params)
    assert scores["median"] > 0.5 and scores["weighted_mean"] < 0.3, scores


PROBE = '''
"""A job's own workflow that tries to reach what it must not: the server's key and kit."""
import os

from atoll.workflow import Model, Workflow


class Probe(Workflow):
    def run(self):
        tried = {}
        for path in self.args["paths"]:
            try:
                with open(path, "rb") as handle:
                    tried[path] = f"read {len(handle.read())} bytes"
            except OSError as exc:
                tried[path] = type(exc).__name__
        tried["environ"] = sorted(k for k in os.environ if k.startswith("ATOLL_"))
        tried["cwd"] = os.getcwd()
        replies = self.ctx.ask("train", Model(), timeout=120)  # the link to its sites works
        tried["replied"] = sorted(replies.results)
        self.ctx.save_json("probe", tried)
'''


def test_a_jobs_own_workflow_runs_confined_with_its_link_and_folder(fed, tmp_path):
    key = fed.kit("server") / "startup" / "server.key"
    assert key.is_file()  # it is there, on the same host, for the server parent
    secrets = [str(key), str(fed.kit("server") / "local" / "site.yaml"),
               str(fed.workspace("server") / "jobs.db")]
    job = tmp_path / "probe"
    (job / "app").mkdir(parents=True)
    (job / "meta.json").write_text(json.dumps({"name": "probe", "deploy_map": {"app": ["@ALL"]}}))
    (job / "app" / "probe.py").write_text(PROBE)
    (job / "app" / "train.py").write_text(
        "import numpy as np\nimport atoll.client as fl\nfl.init()\nwhile fl.is_running():\n"
        "    fl.receive()\n    fl.send(fl.Model(params={'w': np.zeros(1)}, num_examples=1))\n")
    (job / "app" / "app.yaml").write_text(yaml.safe_dump({
        "server": {"workflow": "probe.py:Probe", "args": {"paths": secrets}},
        "site": {"script": "train.py"}}))
    out = _run(fed, job, tmp_path)
    probe = json.loads(next(out.rglob("probe.json")).read_text())
    for path in secrets:
        assert probe[path] in ("FileNotFoundError", "PermissionError"), (path, probe[path])
    assert "ATOLL_JOB_TOKEN" not in probe["environ"]
    assert probe["replied"] == SITES
