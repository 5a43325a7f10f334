"""A job survives a kill -9 of the server parent (issue 37): the restarted server resumes it
from its last checkpoint with a new server worker, the sites' workers wait out the server's
absence and take its tasks again, and the job ends as if nothing happened: every round once
per site in metrics.csv, the uninterrupted run's final model."""

from __future__ import annotations

import csv
import signal
from collections import Counter

import numpy as np
import pytest

from atoll.fl.serde import load_file
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, job_folder, wait_for

ROUNDS = 8

# Deterministic: the result depends only on the model received and the round. On round 3 of the
# run the test interrupts, the site leaves a marker and holds its reply, so that the server is
# killed while the round is in flight.
SITE = '''
import os
import time
import atoll.client as fl

MARK = {mark!r} and os.path.join(os.environ["ATOLL_WORKDIR"], {mark!r})
fl.init()
site = fl.site_name()
shift, n = {{"site-1": (1.0, 3), "site-2": (-0.5, 1)}}[site]
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    round_ = model.current_round
    if MARK and round_ == 3 and not os.path.exists(MARK):
        open(MARK, "w").close()
        time.sleep(3)  # the reply goes up after the server's kill: lost, the task comes again
    w = model.params["w"] * 0.5 + shift * round_ + 0.01 * round_ ** 2
    fl.send(fl.Model(params={{"w": w}}, num_examples=n, metrics={{"loss": 1.0 / round_}}))
'''

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
        assert self.history == list(range(1, self.args["num_rounds"] + 1)), self.history
        self.ctx.save_model("global_model_final", self.model)
'''
WORKFLOWS["custom"] = f"workflow: my_workflow.py:MyFedAvg\n  args: {{num_rounds: {ROUNDS}}}"


# The interrupted round runs again from its start with fresh keys (the sites never unmasked it).
WORKFLOWS["secagg"] = WORKFLOWS["fedavg"]
PRIVACY = {"secagg": "privacy:\n  secure_aggregation: {}\n"}


def _job(path, workflow, mark=""):
    app = (f"server:\n  {WORKFLOWS[workflow]}\n  initial_model: model.py:make\n"
           f"site:\n  script: train.py\n{PRIVACY.get(workflow, '')}")
    meta = {"name": path.name, "deploy_map": {"app": ["@ALL"]}}
    files = {"train.py": SITE.format(mark=mark), "model.py": INITIAL}
    if workflow == "custom":
        files["my_workflow.py"] = MY_WORKFLOW
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


def _train_rows(folder):
    with open(next(folder.rglob("metrics.csv")), newline="") as fh:
        return Counter((row["round"], row["site"]) for row in csv.DictReader(fh)
                       if row["phase"] == "train" and row["metric"] == "loss")


@pytest.mark.parametrize("workflow", ["fedavg", "fedopt", "custom", "secagg"])
def test_a_kill_9_of_the_server_in_round_3_and_the_job_completes_by_itself(fed, tmp_path,
                                                                            workflow):
    mark = "in-round-3"  # in the site worker's run folder: the sandbox lets it write there
    with fed.session(ADMIN) as s:
        whole = s.submit(_job(tmp_path / "whole", workflow), wait=True, timeout=300)
        assert whole["state"] == "FINISHED:COMPLETED", whole
        expected = _final(s.download(whole["job_id"], tmp_path / "whole-out"))
        job_id = s.submit(_job(tmp_path / "cut", workflow, mark))["job_id"]
    wait_for(lambda: list(fed.workspace("site-1").rglob(mark)), 120, "round 3 in flight")
    fed.kill("server", signal.SIGKILL)
    fed.start_server()
    with fed.session(ADMIN) as s:
        final = s.wait(job_id, timeout=300)
        assert final["state"] == "FINISHED:COMPLETED", (final["reason"], final["parts"])
        status = s.status(job_id)
        out = s.download(job_id, tmp_path / "cut-out")
    assert "resumed at round 3 after a server restart" in str(status), status
    run = fed.workspace("server") / "jobs" / job_id / "run" / "server"
    assert (run / "results").is_dir() and not (run / "checkpoint").exists()  # freed at the end
    np.testing.assert_allclose(_final(out), expected, rtol=0, atol=1e-9)
    rows = _train_rows(out)
    assert rows == Counter({(str(r), site): 1 for r in range(1, ROUNDS + 1)
                            for site in ("site-1", "site-2", "global")}), rows


def _kill_in_round_3(fed, tmp_path, workflow="fedavg"):
    with fed.session(ADMIN) as s:
        job_id = s.submit(_job(tmp_path / "cut", workflow, "in-round-3"))["job_id"]
    wait_for(lambda: list(fed.workspace("site-1").rglob("in-round-3")), 120, "round 3 in flight")
    fed.kill("server", signal.SIGKILL)
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
    assert _train_rows(out) == Counter({(str(r), site): 1 for r in range(1, ROUNDS + 1)
                                        for site in ("site-1", "site-2", "global")})
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
