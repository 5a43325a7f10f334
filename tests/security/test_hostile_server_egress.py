"""A job's own server-side workflow is the attacker: it asks the site script under task names of
its choosing, several times per round, and looks at what comes back. A site whose
local/privacy.yaml requires DP (and, for one job, secure aggregation) must never let its raw
trained weights or its clear example count out, must refuse replies its policy cannot classify,
and keeps its DP budget per study across jobs, in a ledger its parent holds.

Real local federation: a server and two site parents as processes, mutual TLS, SQLite; only
site-1 has a privacy.yaml. Epsilons are checked against Opacus's RDP accountant, called here
directly (not through atoll's accounting)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from opacus.accountants import RDPAccountant

from tests.integration.federation.harness import Federation, job_folder

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
SITES = ["site-1", "site-2"]
STUDIES = {name: {"sites": SITES, "admins": []}
           for name in ("alpha", "beta", "gamma", "secure", "echo")}
RUNTIME = "format_version: 2\nstudies:\n" + "".join(f"  {name}: {{}}\n" for name in STUDIES)
BUDGET = 8.0
POLICY = f"""format_version: 1
require: {{max_clip_norm: 1.0, min_noise_multiplier: 1.0}}
budget: {{epsilon: {BUDGET}, delta: 1.0e-5}}
"""
SECURE_POLICY = POLICY.replace("min_noise_multiplier: 1.0}",
                               "min_noise_multiplier: 1.0, secure_aggregation: true}")
COHORT = [31.25, 47.5, 52.75, 68.125]  # site-1's records: none of it may leave site-1

# An ordinary site script: it trains on every task but validate (as most scripts do: "if
# evaluate, report metrics; else train"), and describes its cohort when asked to.
TRAIN = f'''
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={{"accuracy": 0.5}}, num_examples=7))
        continue
    if fl.task_name() == "describe":
        fl.send(fl.Model(meta={{"cohort": {{"ages": {COHORT!r}}}}}))
        continue
    step = 0.01 * int(fl.site_name().split("-")[1])
    fl.send(fl.Model(params={{k: v + step for k, v in model.params.items()}}, num_examples=10))
'''
MODEL = '''
import numpy as np

def make():
    return {"w": np.zeros((4, 4), np.float32)}
'''
# The attacker: whatever it is told to ask, it records what each site sent back.
HOSTILE = '''
import secrets

import numpy as np
from atoll.workflow import Workflow


class Hostile(Workflow):
    def run(self) -> None:
        ctx, seen = self.ctx, []
        model = ctx.initial_model

        def ask(name, round_, args=None):
            got = ctx.gather(ctx.send(name, model, round=round_, args=args), timeout=120,
                             min_replies=0, require_min=False)
            for site, reply in got.results.items():
                step = 0.01 * int(site.split("-")[1])
                entry = {"task": name, "round": round_, "site": site,
                         "num_examples": reply.num_examples, "meta": reply.meta,
                         "params": bool(reply.params), "params_type": reply.params_type}
                if reply.params:
                    w = np.asarray(reply.params["w"], dtype=np.float64)
                    entry["raw"] = bool(np.allclose(w, model.params["w"] + step)
                                        or np.allclose(w, step))
                seen.append(entry)
            for site, reason in got.failed.items():
                seen.append({"task": name, "round": round_, "site": site, "error": reason})
            ctx.save_json("egress", {"seen": seen})

        plan = self.args.get("plan", "names")
        if plan == "names":
            names = ["train", "evaluate", "train2", "submit_model", "validate",
                     "x" + secrets.token_hex(4)]
            for round_ in (1, 2):
                for name in names:
                    for _ in range(2):
                        ask(name, round_)
        elif plan == "secure":
            ask("validate", 1)
            result = ctx.secure_round(model, round=1, timeout=120)
            seen.append({"secure_round": sorted(result.ok)})
            for name in ("submit_model", "evaluate", "validate"):
                ask(name, 1)
        elif plan == "describe":
            ask("describe", 1, args={"blob": {"a": [1, 2]}})
        elif plan == "remask":
            # the secure round's own train task, shares and all, sent a second time under
            # another name: two updates masked alike would give away their difference
            inner, copies = ctx._channel, []

            class Twice:
                def __getattr__(self, name):
                    return getattr(inner, name)

                def send(self, targets, topic, headers, payload):
                    chunks = [bytes(c) for c in payload]
                    task_id = inner.send(targets, topic, headers, chunks)
                    if topic == "train":
                        copies.append(inner.send(targets, "train2", headers, chunks))
                    return task_id

            ctx._channel = Twice()
            try:
                ctx.secure_round(model, round=1, timeout=60)
            except Exception as exc:  # the round may fail: the sites refused the copy
                seen.append({"secure_round_error": str(exc)[:500]})
            ctx._channel = inner
            for task_id in copies:
                for reply in inner.replies(task_id, timeout=60):
                    entry = {"task": "train2", "round": 1, "site": reply.site}
                    if reply.error:
                        entry["error"] = reply.error
                    else:
                        from atoll.fl.serde import ModelStream

                        got = ModelStream(reply.chunks).read()
                        entry.update(params=bool(got.params), num_examples=got.num_examples)
                    seen.append(entry)
        ctx.save_json("egress", {"seen": seen})
'''
HOSTILE_APP = """server:
  workflow: hostile.py:Hostile
  args: {{plan: {plan}}}
  initial_model: model.py:make
site:
  script: train.py
privacy:
  dp: {{clip_norm: 1.0, noise_multiplier: {noise}, delta: 1.0e-5}}
{extra}"""
FEDAVG_APP = """server:
  workflow: fedavg
  args: {num_rounds: 2, round_timeout: 120}
  initial_model: model.py:make
site:
  script: train.py
privacy:
  dp: {clip_norm: 1.0, noise_multiplier: 1.0, delta: 1.0e-5}
"""


def rdp_epsilon(noise: float, releases: int, delta: float = 1e-5) -> float:
    """Opacus's own accountant, step by step: ``releases`` Gaussian releases, sampling rate 1."""
    accountant = RDPAccountant()
    for _ in range(releases):
        accountant.step(noise_multiplier=noise, sample_rate=1.0)
    return float(accountant.get_epsilon(delta=delta))


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    federation = Federation.provisioned(tmp_path_factory.mktemp("fed"), SITES, USERS, STUDIES,
                                        runtime={s: RUNTIME for s in SITES})
    (federation.kit("site-1") / "local" / "privacy.yaml").write_text(POLICY)
    federation.start_all()
    federation.wait_online(ADMIN)
    yield federation
    federation.stop_all()


def _results(session, job_id: str, dest: Path) -> Path:
    archive = session.download(job_id, dest / "download")
    if archive.is_file():
        folder = dest / "results"
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)
        return folder
    return archive


def _run(fed, tmp: Path, name: str, study: str, app: str, files: dict[str, str]):
    path = job_folder(tmp / name, {"name": name, "deploy_map": {"app": ["@ALL"]}}, app,
                      {"train.py": TRAIN, "model.py": MODEL, **files})
    with fed.session(ADMIN, study=study) as s:
        job = s.submit(path, wait=True, timeout=420)
        logs = s.logs(job["job_id"])["logs"]
        folder = _results(s, job["job_id"], tmp / f"{name}-out")
    return job, logs, folder


def _hostile(fed, tmp: Path, name: str, study: str, plan: str, noise: float = 4.0,
             extra: str = ""):
    app = HOSTILE_APP.format(plan=plan, noise=noise, extra=extra)
    job, logs, folder = _run(fed, tmp, name, study, app, {"hostile.py": HOSTILE})
    egress = next(folder.rglob("egress.json"), None)
    assert egress is not None, (job, logs)
    return job, logs, json.loads(egress.read_text())["seen"]


def _ledger(fed, study: str) -> dict:
    path = fed.workspace("site-1") / "privacy_ledger" / f"{study}.json"
    return json.loads(path.read_text())["spent"]["dp"]


def _site_log(logs: dict[str, str], site: str) -> str:
    return "\n".join(text for name, text in logs.items() if site in name)


def test_other_task_names_get_only_noised_updates_each_accounted(fed, tmp_path):
    job, logs, seen = _hostile(fed, tmp_path, "names", "gamma", "names")
    site1 = [e for e in seen if e.get("site") == "site-1"]
    with_params = [e for e in site1 if e.get("params")]
    assert not [e for e in site1 if "error" in e], site1  # every ask answered
    # five of the six names (all but validate) make the script train: 5 x 2 asks x 2 rounds
    assert len(with_params) == 20, site1
    raw = [(e["task"], e["round"]) for e in with_params if e["raw"]]
    assert raw == [], f"site-1 sent its raw trained weights for {raw}"
    assert {e["params_type"] for e in with_params} == {"diff"}  # the clipped, noised update
    assert {e["task"] for e in with_params} >= {"train", "evaluate", "train2", "submit_model"}
    # each release was accounted, in the study's ledger at site-1's parent
    [(job_id, (spent, delta))] = _ledger(fed, "gamma").items()
    assert job_id == job["job_id"]
    assert spent == pytest.approx(rdp_epsilon(4.0, 20), rel=1e-9)
    assert delta == 1e-5


def test_a_studys_budget_holds_across_its_jobs_and_the_refusal_names_the_ledger(fed, tmp_path):
    first, _, _ = _run(fed, tmp_path, "alpha-1", "alpha", FEDAVG_APP, {})
    assert first["state"] == "FINISHED:COMPLETED", first
    after_first = _ledger(fed, "alpha")
    assert after_first == {first["job_id"]: [pytest.approx(rdp_epsilon(1.0, 2)), 1e-5]}
    assert rdp_epsilon(1.0, 2) <= BUDGET < rdp_epsilon(1.0, 2) + rdp_epsilon(1.0, 1)

    second, logs, _ = _run(fed, tmp_path, "alpha-2", "alpha", FEDAVG_APP, {})
    assert second["state"] == "FINISHED:FAILED", second
    site_log = _site_log(logs, "site-1")
    assert ("BudgetExhausted: privacy ledger of site site-1, study alpha, kind dp" in site_log
            and f"the budget epsilon {BUDGET}" in site_log
            and f"has spent epsilon {rdp_epsilon(1.0, 2):.4g}" in site_log), site_log[-3000:]
    assert _ledger(fed, "alpha") == after_first  # the refused job spent nothing

    other, _, _ = _run(fed, tmp_path, "beta-1", "beta", FEDAVG_APP, {})
    assert other["state"] == "FINISHED:COMPLETED", other  # another study: its own ledger
    assert _ledger(fed, "beta") == {other["job_id"]: [pytest.approx(rdp_epsilon(1.0, 2)), 1e-5]}


def test_with_secure_aggregation_no_update_or_count_leaves_unmasked(fed, tmp_path):
    policy = fed.kit("site-1") / "local" / "privacy.yaml"
    policy.write_text(SECURE_POLICY)  # read again at each launch
    try:
        _, logs, seen = _hostile(fed, tmp_path, "secure", "secure", "secure",
                                 extra="  secure_aggregation: {threshold: 2}\n")
    finally:
        policy.write_text(POLICY)
    assert {"secure_round": SITES} in seen, seen  # the legitimate round went through
    site1 = [e for e in seen if e.get("site") == "site-1"]
    counts = [e["num_examples"] for e in site1 if "num_examples" in e]
    assert counts and set(counts) == {0}, f"site-1 sent its example count in clear: {site1}"
    leaked = [e["task"] for e in site1 if e.get("params")]
    assert leaked == [], f"site-1 sent unmasked params for {leaked}"
    refused = [e for e in site1 if e["task"] == "submit_model"]
    assert refused and "error" in refused[0], site1
    assert "secure aggregation" in _site_log(logs, "site-1")


def test_a_reply_the_policy_cannot_classify_is_refused(fed, tmp_path):
    _, logs, seen = _hostile(fed, tmp_path, "describe", "echo", "describe")
    [site1] = [e for e in seen if e.get("site") == "site-1"]
    assert "error" in site1, f"site-1 sent a reply its policy cannot classify: {site1}"
    assert "31.25" not in json.dumps(site1)
    assert "cannot classify" in _site_log(logs, "site-1")
    # site-2 has no privacy.yaml: it sends what its script sends (the check can see it)
    [site2] = [e for e in seen if e.get("site") == "site-2"]
    assert site2["meta"]["cohort"]["ages"] == COHORT


def test_one_rounds_shares_never_mask_a_second_update(fed, tmp_path):
    policy = fed.kit("site-1") / "local" / "privacy.yaml"
    policy.write_text(SECURE_POLICY)
    try:
        _, logs, seen = _hostile(fed, tmp_path, "remask", "secure", "remask",
                                 extra="  secure_aggregation: {threshold: 2}\n")
    finally:
        policy.write_text(POLICY)
    copies = [e for e in seen if e.get("task") == "train2" and e.get("site") == "site-1"]
    assert copies, seen  # the copy reached site-1 and was answered, one way or the other
    assert [e for e in copies if e.get("params")] == [], \
        f"site-1 masked a second update with round 1's shares: {copies}"
    # refused by secure aggregation's own rule (a second train task in one round) or, were
    # that gone, by the egress rule (tests/unit/fl/privacy/test_egress.py checks it alone)
    log = _site_log(logs, "site-1")
    assert ("a second train task in one round" in log or "reveal the difference" in log), \
        [line for line in log.splitlines() if "refus" in line or "rule" in line]
