"""One study's oversized job cannot break another study's job at a shared site (issue #20).

A 9 MB meta.json (one site repeated 900,000 times) used to be forwarded to the site in one
control message over gRPC's limit: the site's link broke and a running job of another study
there failed. Now the server refuses it at submit, as it refuses a repeated or too long site
list, naming the field; the other study's job at the same site runs on and completes.
"""

from __future__ import annotations

import json

import grpc
import pytest

from atoll.admin.errors import Refused
from atoll.admin.session import Session
from atoll.spec.errors import SpecError
from tests.integration.federation.harness import Federation, job_folder
from tests.integration.federation.jobs import app_yaml
from tests.integration.federation.zips import job_zip, submit

LEAD_A, LEAD_B = "lead@a.org", "lead@b.org"
USERS = [{"name": LEAD_A, "org": "org-a", "role": "lead"},
         {"name": LEAD_B, "org": "org-b", "role": "lead"}]
STUDIES = {"alpha": {"sites": ["shared"], "admins": [LEAD_A]},
           "beta": {"sites": ["shared"], "admins": [LEAD_B]}}
RUNTIME = """format_version: 2
studies:
  alpha:
    datasets:
      gate: {{source: {gate}, mode: ro}}
  beta: {{}}
"""

# Holds its round until the test puts `release` in the alpha study's `gate` dataset (the one
# host folder a sandboxed worker sees): the job is surely running at the shared site while the
# other study's bad jobs come in.
HOLD = '''
import json
import os
import time
import atoll.client as fl

gate = json.loads(os.environ["ATOLL_DATASETS"])["gate"]
fl.init()
model = fl.receive()
while not os.path.exists(os.path.join(gate, "release")):
    time.sleep(0.05)
fl.send(fl.Model(params=model.params, num_examples=1, metrics={"ok": 1.0}))
'''


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def fed(tmp_path_factory, gate):
    fed = Federation.provisioned(tmp_path_factory.mktemp("bounded"), ["shared"], USERS,
                                 STUDIES, runtime={"shared": RUNTIME.format(gate=gate)})
    fed.start_all()
    fed.wait_online(LEAD_A, study="alpha")
    yield fed
    fed.stop_all()


def _running_at_shared(session, job_id: str) -> None:
    status = session.status(job_id)
    while status["parts"]["shared"]["state"] != "RUNNING":
        assert not status["state"].startswith("FINISHED"), (status["reason"], status["parts"])
        status = session.status(job_id, since=status["version"], wait_s=10)


def test_an_oversized_or_repeated_site_list_is_refused_and_the_other_study_runs_on(
        fed, gate, tmp_path):
    held = job_folder(tmp_path / "alpha-job", {"name": "alpha-job",
                                               "deploy_map": {"app": ["server", "shared"]}},
                      app_yaml(), {"train.py": HOLD})
    with fed.session(LEAD_A, study="alpha") as alpha:
        job_id = alpha.submit(held)["job_id"]
        _running_at_shared(alpha, job_id)

        with fed.session(LEAD_B, study="beta") as beta:
            deploy = {"app": ["server", "shared"]}
            # The document, sent as a hostile client would (no check before upload).
            huge = {"name": "huge", "deploy_map": deploy, "mandatory_clients": ["shared"] * 900_000}
            too_big = f"meta.json is {len(json.dumps(huge)):,} bytes; the limit is 1,048,576"
            code, details = submit(beta, job_zip(huge))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert too_big in details
            # The same through the Session: checked before the upload, the same words.
            folder = job_folder(tmp_path / "huge", huge, app_yaml(), {})
            with pytest.raises(SpecError) as here:
                beta.submit(folder)
            assert too_big in str(here.value)
            # Within the size limit: a site listed twice, a list over its limit.
            repeated = {**huge, "mandatory_clients": ["shared", "shared"]}
            (folder / "meta.json").write_text(json.dumps(repeated))
            with pytest.raises(Refused, match=r"mandatory_clients\[1\]: 'shared' is already "
                                              r"listed at \[0\]; list each site once"):
                beta.submit(folder)
            (folder / "meta.json").write_text(json.dumps({**huge, "mandatory_clients":
                                                         ["shared"] * 10_001}))
            with pytest.raises(Refused, match=r"mandatory_clients: lists 10,001 sites; at most "
                                              r"10,000"):
                beta.submit(folder)
            assert beta.list_jobs() == []
            assert {s["name"]: s["online"] for s in beta.sites()["sites"]} == {"shared": True}

        # A status call that waits for a change longer than its session's timeout is answered,
        # unchanged, when the wait is over: its deadline is the wait plus that timeout.
        with Session(fed.kit(LEAD_A), study="alpha", timeout=1.0) as short:
            now = short.status(job_id)
            assert short.status(job_id, since=now["version"], wait_s=2.0)["version"] == \
                now["version"]

        (gate / "release").touch()
        job = alpha.wait(job_id, timeout=120)
    assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"])
    assert job["parts"]["shared"]["state"] == "FINISHED:COMPLETED"
    assert "link broken" not in fed.log("shared")  # the site's link never broke


EXITS = '''
import os
import atoll.client as fl

fl.init()
fl.receive()
os._exit(3)  # no report: the reason is the launcher's
'''


def test_failure_reasons_name_the_job_not_the_parents_paths(fed, tmp_path):
    job = job_folder(tmp_path / "exits", {"name": "exits",
                                          "deploy_map": {"app": ["server", "shared"]}},
                     app_yaml(), {"train.py": EXITS})
    with fed.session(LEAD_A, study="alpha") as alpha:
        done = alpha.wait(alpha.submit(job)["job_id"], timeout=120)
    assert done["state"] == "FINISHED:FAILED"
    shown = json.dumps(done)
    for parent in ("server", "shared"):
        for path in {fed.kit(parent), fed.kit(parent).resolve()}:
            assert str(path) not in shown, shown
    reason = done["parts"]["shared"]["reason"]
    assert f"worker exited with code 3; see the job's logs (atoll job logs {done['job_id']})" in \
        reason, reason
