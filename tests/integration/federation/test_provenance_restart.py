"""A job's provenance record across a restart of the server parent (real processes, mutual TLS):
the server is killed (SIGKILL: nothing of it runs at its end) after the site's entries are in
the record, and the restarted server continues the same chain from its file: the job's end is
appended after the entries made before the restart, and the record verifies as one chain."""

from __future__ import annotations

import json
import signal
import time

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, job_folder
from tests.integration.federation.test_provenance import APP, MODEL, atoll

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
                        APP, {"train.py": SLOW, "model.py": MODEL})
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
