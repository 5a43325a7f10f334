"""A site script that hangs while its worker's heartbeat thread beats on is bounded (issue 37):
a part that holds its task with no call to the client API, no bytes moving and no progress
report for supervision.progress_s is restarted once for the round in flight, then failed with a
reason naming what stalled, whatever the round's timeout; a script that trains longer than the
bound but reports its progress is left alone. On a real local federation."""

from __future__ import annotations

import pytest

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job

PROGRESS_S = 3

# site-1's script takes its task and never answers (a deadlock, say): only the worker's own
# heartbeat thread still calls the site parent. site-2 answers at once.
HANGS = '''
import time
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    if fl.site_name() == "site-1":
        print(f"hangs in round {model.current_round}", flush=True)
        time.sleep(3600)
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={"ok": 1.0}))
'''

# Trains for twice the bound each round, reporting its loss every half second.
REPORTS = f'''
import time
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    for step in range({PROGRESS_S * 4}):
        time.sleep(0.5)
        fl.log_metrics({{"loss": 1.0 / (step + 1)}}, step=step)
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={{"ok": 1.0}}))
'''


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("hung"), ["site-1", "site-2"], USERS)
    for site in fed.sites:  # a bound of seconds; the heartbeat stall far above it
        with open(fed.kit(site) / "local" / "site.yaml", "a") as out:
            out.write(f"\nsupervision: {{heartbeat_s: 0.5, stall_s: 60, "
                      f"progress_s: {PROGRESS_S}}}\n")
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def test_a_hung_script_is_restarted_once_then_failed_naming_the_stall(fed, tmp_path):
    with fed.session(ADMIN) as s:  # the round waits an hour: the site's bound ends it
        final = s.submit(make_job(tmp_path / "hung", script=HANGS, rounds=2, min_clients=2,
                                  round_timeout=3600), wait=True, timeout=180)
    part = final["parts"]["site-1"]
    assert part["state"] == "FINISHED:FAILED", final
    assert part["reason"] == (
        f"site-1's part held its task of round 1 for {PROGRESS_S} s with no call to the client "
        "API, no bytes moving and no progress report (supervision.progress_s): its script may "
        "hang"), part["reason"]
    assert final["state"] == "FINISHED:FAILED" and "site-1" in final["reason"], final
    assert final["parts"]["site-2"]["state"] != "FINISHED:FAILED", final
    site_log = fed.log("site-1")
    assert "its script may hang; its part starts again" in site_log  # retried once first


def test_a_long_round_that_reports_progress_is_not_stopped(fed, tmp_path):
    with fed.session(ADMIN) as s:
        final = s.submit(make_job(tmp_path / "long", script=REPORTS, rounds=2),
                         wait=True, timeout=180)
    assert final["state"] == "FINISHED:COMPLETED", final
    stalls = [line for line in (fed.log("site-1") + fed.log("site-2")).splitlines()
              if final["job_id"] in line and "progress_s" in line]
    assert stalls == []
