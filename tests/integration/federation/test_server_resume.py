"""A job survives a kill -9 of the server parent (issue 37): the restarted server resumes it
from its last checkpoint with a new server worker, the sites' workers wait out the server's
absence and take its tasks again, and the job ends as if nothing happened: every round once
per site in metrics.csv and once in the job's events, the uninterrupted run's final model, and
`atoll job watch` saying where it resumed."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from atoll.fl.serde import load_file
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import (
    Federation,
    found,
    job_folder,
    wait_checkpointed,
    wait_for,
)

ROUNDS = 8

# Deterministic: the result depends only on the model received and the round. On round 3 of the
# run site-1 leaves a marker and holds its reply until the test leaves a "go-3" file beside it,
# once it has killed the server: the round is in flight at the kill whatever the machine's load,
# and the reply goes up to a server that is gone (lost: the task comes again). With HOLD, site-1
# then holds round 4 (of the resumed run) until a "go" file: the job is surely live while the
# test watches it.
MARKS = '''
import os
import time

MARK = {mark!r} and os.path.join(os.environ["ATOLL_WORKDIR"], {mark!r})
HOLD = {hold!r} and os.path.join(os.environ["ATOLL_WORKDIR"], {hold!r})


def _until(name):
    while not os.path.exists(name):
        time.sleep(0.05)


def interrupt(site, round_):
    if MARK and round_ == 3 and site == "site-1" and not os.path.exists(MARK):
        open(MARK, "w").close()
        _until(os.path.join(os.path.dirname(MARK), "go-3"))
    if HOLD and round_ == 4 and site == "site-1" and not os.path.exists(HOLD):
        open(HOLD, "w").close()
        _until(os.path.join(os.path.dirname(HOLD), "go"))
'''

SITE = '''
import atoll.client as fl
from marks import interrupt

fl.init()
site = fl.site_name()
shift, n = {"site-1": (1.0, 3), "site-2": (-0.5, 1)}[site]
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    round_ = model.current_round
    interrupt(site, round_)
    w = model.params["w"] * 0.5 + shift * round_ + 0.01 * round_ ** 2
    fl.send(fl.Model(params={"w": w}, num_examples=n, metrics={"loss": 1.0 / round_}))
'''

# SCAFFOLD's site (examples/scaffold's client_update) on a deterministic quadratic loss: it keeps
# its control variate after each round, keyed by round as the example's train.py does, so that
# a round the resumed server runs again starts from the same c_i.
SCAFFOLD_SITE = '''
import numpy as np
import atoll.client as fl
from marks import interrupt
from scaffold import client_update

fl.init(evaluate=lambda model: fl.Model(
    metrics={"loss": float(np.sum(model.params["w"] ** 2))}, num_examples=1))
site = fl.site_name()
target = {"site-1": np.array([1.0, -2.0, 0.5, 3.0]), "site-2": np.array([-1.5, 0.5, 2.0, -0.25])}
c_after = {}
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    round_ = model.current_round
    interrupt(site, round_)
    x, c = {"w": model.params["w"]}, {"w": model.params["c/w"]}
    before = [r for r in c_after if r < round_]
    c_i = c_after[max(before)] if before else {"w": np.zeros_like(x["w"])}
    y, c_new = client_update(x, c, c_i, lambda p, step: {"w": p["w"] - target[site]}, 5, 0.1)
    c_after[round_] = c_new
    fl.send(fl.Model(params={"dy/w": y["w"] - x["w"], "dc/w": c_new["w"] - c_i["w"]},
                     num_examples=1, metrics={"loss": 1.0 / round_}))
'''
SCAFFOLD_APP = Path(__file__).resolve().parents[3] / "examples" / "scaffold" / "app"

INITIAL = '''
import numpy as np

def make():
    return {"w": np.array([1.0, 2.0, -3.0, 0.25])}
'''

_ARGS = f"num_rounds: {ROUNDS}, evaluate_every: 0, cross_site_eval: none, round_timeout: 120"
WORKFLOWS = {
    "fedavg": f"workflow: fedavg\n  args: {{{_ARGS}}}",
    "fedopt": f"workflow: fedopt\n  args: {{{_ARGS}, optimizer: adam, server_lr: 0.3, "
              "tau: 0.01}",
}


# A job-shipped workflow on the public API, checkpointing as docs/federated-learning.md shows.
MY_WORKFLOW = '''
from atoll.workflow import Model, WeightedAverage, Workflow


class MyFedAvg(Workflow):
    def state(self):
        return {"params": self.model.params, "history": self.history}

    def restore(self, state):
        self.model, self.history = Model(params=state["params"]), state["history"]

    def run(self):
        if not hasattr(self, "model"):
            self.model, self.history = self.ctx.initial_model, []
        for round_ in range(self.ctx.start_round, self.args["num_rounds"] + 1):
            sent = self.ctx.send("train", self.model, round=round_)
            replies = self.ctx.gather(sent, timeout=120, aggregator=WeightedAverage())
            self.model = Model(params=replies.aggregate, round=round_)
            for site, result in replies.results.items():
                self.ctx.log_metrics(result.metrics, round=round_, site=site)
            self.ctx.log_metrics(replies.mean_metrics(), round=round_)
            self.history.append(round_)
            self.checkpoint(round_)
            self.ctx.report({"event": "round", "round": round_})
        assert self.history == list(range(1, self.args["num_rounds"] + 1)), self.history
        self.ctx.save_model("global_model_final", self.model)
'''
WORKFLOWS["custom"] = f"workflow: my_workflow.py:MyFedAvg\n  args: {{num_rounds: {ROUNDS}}}"


# The interrupted round runs again from its start with fresh keys (the sites never unmasked it).
WORKFLOWS["secagg"] = WORKFLOWS["fedavg"]
PRIVACY = {"secagg": "privacy:\n  secure_aggregation: {}\n"}
# Client-mode DP: each site clips and noises its update; its parent's ledger accounts it.
WORKFLOWS["dp"] = WORKFLOWS["fedavg"]
PRIVACY["dp"] = "privacy:\n  dp: {clip_norm: 10.0, noise_multiplier: 1.0}\n"

# examples/scaffold's workflow as it ships (the global model and control variate checkpointed)
WORKFLOWS["scaffold"] = (f"workflow: scaffold_workflow.py:Scaffold\n  args: {{num_rounds: {ROUNDS}, "
                         "round_timeout: 120}")


def _job(path, workflow, mark="", hold=""):
    app = (f"server:\n  {WORKFLOWS[workflow]}\n  initial_model: model.py:make\n"
           f"site:\n  script: train.py\n{PRIVACY.get(workflow, '')}")
    meta = {"name": path.name, "deploy_map": {"app": ["@ALL"]}}
    files = {"train.py": SITE, "model.py": INITIAL, "marks.py": MARKS.format(mark=mark, hold=hold)}
    if workflow == "custom":
        files["my_workflow.py"] = MY_WORKFLOW
    if workflow == "scaffold":
        files["train.py"] = SCAFFOLD_SITE
        for name in ("scaffold.py", "scaffold_workflow.py"):
            files[name] = (SCAFFOLD_APP / name).read_text()
    return job_folder(path, meta, app, files)


@pytest.fixture
def fed(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1", "site-2"], USERS)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _final(folder):
    return load_file(next(folder.rglob("global_model_final.safetensors"))).params["w"]


def _train_rows(folder, phase="train"):
    with open(next(folder.rglob("metrics.csv")), newline="") as fh:
        return Counter((row["round"], row["site"]) for row in csv.DictReader(fh)
                       if row["phase"] == phase and row["metric"] == "loss")


def _once(*sites):
    return Counter({(str(r), site): 1 for r in range(1, ROUNDS + 1) for site in sites})


def atoll(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "atoll", *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("workflow", ["fedavg", "fedopt", "scaffold", "custom", "secagg"])
def test_a_kill_9_of_the_server_in_round_3_and_the_job_completes_by_itself(fed, tmp_path,
                                                                            workflow):
    mark = "in-round-3"  # in the site worker's run folder: the sandbox lets it write there
    with fed.session(ADMIN) as s:
        whole = s.submit(_job(tmp_path / "whole", workflow), wait=True, timeout=300)
        assert whole["state"] == "FINISHED:COMPLETED", whole
        expected = _final(s.download(whole["job_id"], tmp_path / "whole-out"))
        job_id = s.submit(_job(tmp_path / "cut", workflow, mark, "in-round-4"))["job_id"]
    _kill_when_held(fed, job_id, mark)
    fed.start_server()
    # site-1 holds round 4 of the resumed run: the job is live while `job watch` attaches
    [held] = wait_for(lambda: found(fed.workspace("site-1"), "in-round-4"), 120,
                      "round 4 of the resumed run")
    watch = atoll("job", "watch", job_id, "--kit", fed.kit(ADMIN), "--timeout", 300)
    seen = []
    for line in watch.stdout:  # until it shows the server part's state (or ends)
        seen.append(line)
        if line.split()[:1] == ["server"]:
            break
    (held.parent / "go").touch()
    rest, _ = watch.communicate(timeout=300)
    watched = "".join(seen) + rest
    assert watch.returncode == 0, watched
    assert re.search(r"server +RUNNING \(resumed at round 3 after a server restart\)", watched), \
        watched
    assert "FINISHED:COMPLETED" in watched, watched
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=300)
        assert final["state"] == "FINISHED:COMPLETED", (final["reason"], final["parts"])
        status = s.status(job_id)
        events = s.logs(job_id)["events"]
        out = s.download(job_id, tmp_path / "cut-out")
    assert "resumed at round 3 after a server restart" in str(status), status
    run = fed.workspace("server") / "jobs" / job_id / "run" / "server"
    assert (run / "results").is_dir() and not (run / "checkpoint").exists()  # freed at the end
    np.testing.assert_allclose(_final(out), expected, rtol=0, atol=1e-9)
    # each round reported once: none lost with the killed worker, none told twice
    rounds = Counter(e["round"] for e in events
                     if e.get("event") == "round" and e["source"] == "server")
    assert rounds == Counter(range(1, ROUNDS + 1)), events
    rows = _train_rows(out)
    if workflow == "scaffold":  # its sites' training metrics, then the validated global model
        assert rows == _once("site-1", "site-2"), rows
        validated = _train_rows(out, "validate")
        assert validated == _once("site-1", "site-2", "global"), validated
    else:
        assert rows == _once("site-1", "site-2", "global"), rows


def _kill_when_held(fed, job_id, mark, sig=signal.SIGKILL, **kill):
    """Kill (or stop) the server while site-1 holds round 3, once round 2's checkpoint is
    recorded (the restart resumes at round 3); then let site-1's reply go up to the server
    that is gone."""
    [held] = wait_for(lambda: found(fed.workspace("site-1"), mark), 120, "round 3 in flight")
    wait_checkpointed(fed, ADMIN, job_id, 2)
    fed.kill("server", sig, **kill)
    (held.parent / "go-3").touch()


def _kill_in_round_3(fed, tmp_path, workflow="fedavg"):
    with fed.session(ADMIN) as s:
        job_id = s.submit(_job(tmp_path / "cut", workflow, "in-round-3"))["job_id"]
    _kill_when_held(fed, job_id, "in-round-3")
    return job_id


def test_a_damaged_checkpoint_fails_the_job_saying_so(fed, tmp_path):
    job_id = _kill_in_round_3(fed, tmp_path)
    folder = fed.workspace("server") / "jobs" / job_id / "run" / "server" / "checkpoint"
    state = next(folder.glob("round-*.safetensors"))
    data = bytearray(state.read_bytes())
    data[-1] ^= 0x01  # one bit of the model
    state.write_bytes(bytes(data))
    fed.start_server()
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=300)
    assert final["state"] == "FINISHED:FAILED", final
    assert "cannot resume after the server restart" in final["reason"], final["reason"]
    assert "is damaged" in final["reason"], final["reason"]
    assert final["parts"]["server"]["state"] == "FINISHED:FAILED"  # never left live
    assert all(p["state"].startswith("FINISHED:") for p in final["parts"].values())


def test_a_second_kill_during_the_restart_still_ends_the_job(fed, tmp_path):
    job_id = _kill_in_round_3(fed, tmp_path)
    fed.start_server()
    fed.kill("server", signal.SIGKILL)  # again, while it resumes
    fed.start_server()
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=300)
        out = s.download(job_id, tmp_path / "out")
    assert final["state"] == "FINISHED:COMPLETED", final
    assert _train_rows(out) == _once("site-1", "site-2", "global")
    resumes = fed.workspace("server") / "jobs" / job_id / "resumes.json"
    assert resumes.read_text() == '{"resumes": 2}'


def test_max_resumes_zero_fails_the_job_naming_the_setting(fed, tmp_path):
    site_yaml = fed.kit("server") / "local" / "site.yaml"
    job_id = _kill_in_round_3(fed, tmp_path)
    before = site_yaml.read_text() if site_yaml.exists() else "launcher: process\n"
    site_yaml.write_text(before + "restarts: {max_resumes: 0}\n")
    fed.start_server()
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=120)
    assert final["state"] == "FINISHED:FAILED"
    assert "restarts.max_resumes is 0" in final["reason"], final["reason"]


def test_dp_epsilon_goes_on_and_each_sites_ledger_keeps_what_it_spent(fed, tmp_path):
    from atoll.fl.privacy.accounting import epsilon

    job_id = _kill_in_round_3(fed, tmp_path, "dp")
    fed.start_server()
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=300)
        assert final["state"] == "FINISHED:COMPLETED", (final["reason"], final["parts"])
        out = s.download(job_id, tmp_path / "out")
    # the job's epsilon: every round once, on from round 2's (never from zero again)
    with open(next(out.rglob("metrics.csv")), newline="") as fh:
        spent = [(int(row["round"]), float(row["value"])) for row in csv.DictReader(fh)
                 if row["phase"] == "privacy" and row["metric"] == "epsilon"]
    assert [r for r, _ in spent] == list(range(1, ROUNDS + 1)), spent
    np.testing.assert_allclose([e for _, e in spent],
                               [epsilon(1.0, r, 1e-5) for r in range(1, ROUNDS + 1)])
    # each site's ledger (its parent's file) holds every release the site made: site-1 (the
    # test waited for it) answered round 3 before the kill and again after it; site-2 the same,
    # unless the kill came before round 3's task reached it. Nothing forgotten or reset.
    def job_eps(site):
        [ledger] = (fed.workspace(site) / "privacy_ledger").glob("*.json")
        return json.loads(ledger.read_text())["spent"]["dp"][job_id][0]

    assert job_eps("site-1") == pytest.approx(epsilon(1.0, ROUNDS + 1, 1e-5))
    assert job_eps("site-2") in (pytest.approx(epsilon(1.0, ROUNDS, 1e-5)),
                                 pytest.approx(epsilon(1.0, ROUNDS + 1, 1e-5)))
