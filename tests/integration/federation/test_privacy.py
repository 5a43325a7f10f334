"""Privacy over a real local federation (processes, mutual TLS, SQLite): a site whose
local/privacy.yaml demands clipping, noise and secure aggregation refuses a weaker job, naming
the rules, and runs a compliant one, whose secure aggregation goes through the parents' relay
and whose epsilon lands in the job's metrics and summary."""

from __future__ import annotations

import csv
import json
import zipfile

import numpy as np
import pytest

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, job_folder
from tests.integration.federation.jobs import privacy_job

SITES = ["site-1", "site-2", "site-3"]
STRICT = """format_version: 1
require: {max_clip_norm: 1.0, min_noise_multiplier: 0.5, secure_aggregation: true}
budget: {epsilon: 50.0, delta: 1.0e-5}
"""
TRAIN = '''
import numpy as np
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 1.0}, num_examples=1))
        continue
    step = 0.01 * int(fl.site_name().split("-")[1])
    fl.send(fl.Model(params={k: v + step for k, v in model.params.items()}, num_examples=10))
'''
MODEL = '''
import numpy as np

def make():
    return {"w": np.zeros((4, 4), np.float32)}
'''
COMPLIANT = """privacy:
  dp: {clip_norm: 1.0, noise_multiplier: 0.5, delta: 1.0e-5}
  secure_aggregation: {threshold: 3}
"""


@pytest.fixture(scope="module")
def strict_federation(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), SITES, USERS)
    (fed.kit("site-1") / "local" / "privacy.yaml").write_text(STRICT)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _job(path, privacy: str):
    return privacy_job(path, privacy, TRAIN, MODEL)


def test_a_strict_site_refuses_a_job_without_privacy_naming_its_rules(strict_federation, tmp_path):
    with strict_federation.session(ADMIN) as s:
        job = s.submit(_job(tmp_path / "plain", ""), wait=True, timeout=240)
    assert job["state"] == "FINISHED:FAILED"
    reason = job["parts"]["site-1"]["reason"]
    assert reason.startswith("site-1 refused the job by its privacy policy (local/privacy.yaml)")
    for rule in ("require.max_clip_norm", "require.min_noise_multiplier",
                 "require.secure_aggregation", "budget.epsilon"):
        assert f"rule {rule}:" in reason


def test_a_compliant_job_runs_with_secure_aggregation_and_reports_epsilon(strict_federation,
                                                                           tmp_path):
    with strict_federation.session(ADMIN) as s:
        job = s.submit(_job(tmp_path / "private", COMPLIANT), wait=True, timeout=300)
        assert job["state"] == "FINISHED:COMPLETED", job
        archive = s.download(job["job_id"], tmp_path / "download")
    folder = tmp_path / "results"
    if archive.is_file():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)
    else:
        folder = archive
    summary = json.loads(next(folder.rglob("summary.json")).read_text())
    from atoll.fl.privacy.accounting import epsilon

    assert summary["privacy"]["secure_aggregation"] is True
    assert summary["privacy"]["epsilon"] == pytest.approx(epsilon(0.5, 2, 1e-5))
    with next(folder.rglob("metrics.csv")).open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["phase"] == "privacy"]
    assert [(r["round"], r["metric"]) for r in rows] == [
        ("1", "epsilon"), ("1", "delta"), ("2", "epsilon"), ("2", "delta")]
    from atoll.fl.serde import load_file

    final = load_file(next(folder.rglob("global_model_final.safetensors"))).params["w"]
    # each site's update (0.01, 0.02, 0.03 everywhere) is under the clip norm; the noise is
    # N(0, 0.5^2) per site and entry, averaged over three sites and two rounds
    assert final.shape == (4, 4) and np.isfinite(final).all()
    assert not np.allclose(final, 0.04)  # noised, so not the plain mean
    # the job's provenance record states the epsilon spent in its end entry, and verifies with
    # the project's CA and the downloaded model (docs/provenance.md)
    from atoll.pki.provenance import file_digest, verify

    ca = (strict_federation.kit(ADMIN) / "startup" / "rootCA.pem").read_bytes()
    model = next(folder.rglob("global_model_final.safetensors"))
    record = verify(next(folder.rglob("provenance.json")).read_bytes(), ca, file_digest(model))
    end = record.entries[-1]
    assert end.kind == "job.final"
    assert end.body["dp_epsilon"] == pytest.approx(summary["privacy"]["epsilon"])


def test_the_site_worker_applies_the_sites_budget_the_parent_cannot_count(strict_federation,
                                                                           tmp_path):
    policy = strict_federation.kit("site-1") / "local" / "privacy.yaml"
    policy.write_text(STRICT.replace("epsilon: 50.0", "epsilon: 1.0"))  # re-read at each launch
    try:
        with strict_federation.session(ADMIN) as s:
            job = s.submit(_job(tmp_path / "over-budget", COMPLIANT), wait=True, timeout=300)
            logs = s.logs(job["job_id"])["logs"]
    finally:
        policy.write_text(STRICT)
    # the parent let it through (the job adds noise); the worker, holding the site's policy
    # from its parent, refused to send the first update: epsilon(0.5, 1 round) is above 1.0
    assert job["state"] == "FINISHED:FAILED"
    site_log = "\n".join(text for name, text in logs.items() if "site-1" in name)
    assert "BudgetExhausted: privacy budget of site site-1 (local/privacy.yaml budget.epsilon)" \
        in site_log


WORKFLOW = '''
from atoll.workflow import Model, Workflow


class MyWorkflow(Workflow):
    def run(self) -> None:
        ctx, rounds = self.ctx, []
        model = ctx.initial_model
        for round_ in (1, 2):
            result = ctx.secure_round(model, round=round_, total_rounds=2, timeout=120)
            model = Model(params=result.aggregate, round=round_)
            rounds.append({"ok": sorted(result.ok), "total_weight": result.total_weight,
                           "privacy": result.privacy, "metrics": result.mean_metrics()})
        ctx.save_model("global_model_final", model)
        ctx.save_json("summary", {"rounds": rounds})
'''


def test_a_job_workflow_runs_a_secure_round_through_the_public_api(strict_federation, tmp_path):
    app = ("server:\n  workflow: my_workflow.py:MyWorkflow\n  initial_model: model.py:make\n"
           "site:\n  script: train.py\n" + COMPLIANT)
    path = job_folder(tmp_path / "custom", {"name": "custom", "deploy_map": {"app": ["@ALL"]}},
                      app,
                      {"train.py": TRAIN, "model.py": MODEL, "my_workflow.py": WORKFLOW})
    with strict_federation.session(ADMIN) as s:
        job = s.submit(path, wait=True, timeout=300)
        assert job["state"] == "FINISHED:COMPLETED", job
        archive = s.download(job["job_id"], tmp_path / "download")
    folder = tmp_path / "results"
    if archive.is_file():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)
    else:
        folder = archive
    from atoll.fl.privacy.accounting import epsilon

    rounds = json.loads(next(folder.rglob("summary.json")).read_text())["rounds"]
    assert [r["ok"] for r in rounds] == [SITES, SITES]
    assert [r["total_weight"] for r in rounds] == [30, 30]  # learned as the masked sum only
    assert [r["privacy"]["epsilon"] for r in rounds] == pytest.approx(
        [epsilon(0.5, 1, 1e-5), epsilon(0.5, 2, 1e-5)])
    from atoll.fl.serde import load_file

    final = load_file(next(folder.rglob("global_model_final.safetensors"))).params["w"]
    assert final.shape == (4, 4) and np.isfinite(final).all()
