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


def _job(path, workflow, mark=""):
    app = (f"server:\n  {WORKFLOWS[workflow]}\n  initial_model: model.py:make\n"
           "site:\n  script: train.py\n")
    meta = {"name": path.name, "deploy_map": {"app": ["@ALL"]}}
    return job_folder(path, meta, app, {"train.py": SITE.format(mark=mark), "model.py": INITIAL})


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


@pytest.mark.parametrize("workflow", ["fedavg", "fedopt"])
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
        assert final["state"] == "FINISHED:COMPLETED", final
        status = s.status(job_id)
        out = s.download(job_id, tmp_path / "cut-out")
    assert "resumed at round 3 after a server restart" in str(status), status
    np.testing.assert_allclose(_final(out), expected, rtol=0, atol=1e-9)
    rows = _train_rows(out)
    assert rows == Counter({(str(r), site): 1 for r in range(1, ROUNDS + 1)
                            for site in ("site-1", "site-2", "global")}), rows
