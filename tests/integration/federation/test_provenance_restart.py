"""A job's provenance record across a restart of the server parent (real processes, mutual TLS):
the server is killed (SIGKILL: nothing of it runs at its end) mid-job, and the restarted server
continues the same chain from its file. A job the restart ends gets its end appended after the
entries made before the restart; a job the restarted server resumes keeps one unbroken chain:
one signed job, each site's entries once, each round's model once (stated as the round
happened, before and after the restart) and one end, verifying offline with the CA and the
downloaded model alone."""

from __future__ import annotations

import json
import signal
import time

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import (
    Federation,
    found,
    job_folder,
    wait_checkpointed,
    wait_for,
)
from tests.integration.federation.test_provenance import APP as TWO_ROUNDS
from tests.integration.federation.test_provenance import MODEL, atoll

SITES = ["site-1"]
# the site trains for longer than the test waits: the job is running when the server dies
SLOW = '''
import time
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    time.sleep(3600)
'''


def _kinds(items_file) -> list[str]:
    if not items_file.exists():
        return []
    return [json.loads(json.loads(line)["item"]["entry"])["kind"]
            for line in items_file.read_text().splitlines() if line.strip()]


def test_a_restarted_server_continues_the_jobs_chain(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", SITES, USERS)
    folder = job_folder(tmp_path / "slow", {"name": "slow", "deploy_map": {"app": ["@ALL"]}},
                        TWO_ROUNDS, {"train.py": SLOW, "model.py": MODEL})
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as s:
            job_id = s.submit(folder)["job_id"]
        items = fed.workspace("server") / "jobs" / job_id / "provenance.jsonl"
        deadline = time.monotonic() + 120
        while "site.launch" not in _kinds(items):
            assert time.monotonic() < deadline, (_kinds(items), fed.log("server"))
            time.sleep(0.1)
        before = _kinds(items)
        fed.kill("server", signal.SIGKILL)
        # the job ends at the restart (resuming is test_server_resume's): the chain gets its end
        site_yaml = fed.kit("server") / "local" / "site.yaml"
        kept_yaml = site_yaml.read_text() if site_yaml.exists() else "launcher: process\n"
        site_yaml.write_text(kept_yaml + "restarts: {max_resumes: 0}\n")
        fed.start_server()
        with fed.session(ADMIN) as s:
            job = s.status(job_id)
        assert job["state"] == "FINISHED:FAILED" and "restarted" in job["reason"], job
        record = tmp_path / "record.json"
        atoll("job", "provenance", job_id, "--out", record, "--kit", fed.kit(ADMIN))
    finally:
        fed.stop_all()
    ca = fed.kit(ADMIN) / "startup" / "rootCA.pem"
    done = atoll("provenance", "verify", record, "--ca", ca, "--format", "json", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = json.loads(record.read_text())["entries"]
    entries = [json.loads(e["entry"]) for e in kept]
    assert [e["kind"] for e in entries] == [*before, "job.final"], entries
    assert [e["seq"] for e in kept] == list(range(len(kept)))  # one chain, nothing forked
    assert entries[-1]["body"]["state"] == "FAILED"
    assert "restarted" in entries[-1]["body"]["reason"]


ROUNDS = 4
RESUMABLE = TWO_ROUNDS.replace("num_rounds: 2", f"num_rounds: {ROUNDS}")
# In round 3 of 4, site-1 leaves a marker in its run folder and holds its reply until the test
# lets it go (a second marker): the server is killed while the round is in flight, whatever the
# machine's load. The resumed round 3 comes again and is answered at once.
HOLDS_ROUND_3 = """
import os
import time
import atoll.client as fl

work = os.environ["ATOLL_WORKDIR"]
fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    held = os.path.join(work, "held-round-3")
    if fl.site_name() == "site-1" and model.current_round == 3 and not os.path.exists(held):
        open(held, "w").close()
        while not os.path.exists(os.path.join(work, "go")):
            time.sleep(0.1)
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={"ok": 1.0}))
"""


def _rounds(items_file) -> list[int]:
    entries = [json.loads(json.loads(line)["item"]["entry"])
               for line in items_file.read_text().splitlines() if line.strip()]
    return [e["body"]["round"] for e in entries if e["kind"] == "round.model"]


def test_a_resumed_job_keeps_one_unbroken_chain(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1", "site-2"], USERS)
    folder = job_folder(tmp_path / "resumed", {"name": "resumed",
                                               "deploy_map": {"app": ["@ALL"]}},
                        RESUMABLE, {"train.py": HOLDS_ROUND_3, "model.py": MODEL})
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as s:
            job_id = s.submit(folder)["job_id"]
        items = fed.workspace("server") / "jobs" / job_id / "provenance.jsonl"
        [held] = wait_for(lambda: found(fed.workspace("site-1"), "held-round-3"), 180,
                          "site-1 holding round 3")
        wait_checkpointed(fed, ADMIN, job_id, 2)  # the restart resumes at round 3
        # each round is stated as it happens: rounds 1 and 2 are in the record mid-job (a
        # round's digest is reported before its checkpoint, on the same thread)
        assert _rounds(items) == [1, 2], _kinds(items)
        fed.kill("server", signal.SIGKILL)
        (held.parent / "go").touch()  # its reply goes up to a server that is gone: lost
        fed.start_server()
        with fed.session(ADMIN) as s:
            final = s.wait(job_id, timeout=300)
            assert final["state"] == "FINISHED:COMPLETED", (final["reason"], final["parts"])
            assert "resumed at round 3 after a server restart" in str(s.status(job_id))
            results = s.download(job_id, tmp_path / "out")
        record = tmp_path / "record.json"
        atoll("job", "provenance", job_id, "--out", record, "--kit", fed.kit(ADMIN))
    finally:
        fed.stop_all()
    model = next(results.rglob("global_model_final.safetensors"))
    ca = fed.kit(ADMIN) / "startup" / "rootCA.pem"
    done = atoll("provenance", "verify", record, "--ca", ca, "--model", model, "--format",
                 "json", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = json.loads(record.read_text())["entries"]
    assert [e["seq"] for e in kept] == list(range(len(kept)))  # one chain, nothing forked
    entries = [json.loads(e["entry"]) for e in kept]
    kinds = [(e["kind"], e["by"]["name"]) for e in entries]
    assert kinds[0] == ("job.signed", "server") and kinds[-1] == ("job.final", "server"), kinds
    for once in [("job.signed", "server"), ("server.intake", "server"), ("job.final", "server"),
                 *((k, site) for k in ("site.decision", "site.launch")
                   for site in ("site-1", "site-2"))]:
        assert kinds.count(once) == 1, (once, kinds)
    rounds = [e["body"] for e in entries if e["kind"] == "round.model"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), rounds
    assert rounds[-1]["digest"] == entries[-1]["body"]["model_digest"]
    assert entries[-1]["body"]["state"] == "COMPLETED"
