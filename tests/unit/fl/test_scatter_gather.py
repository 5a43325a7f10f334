"""``workflow: scatter_gather`` (fl/workflows/scatter_gather.py) through the simulator: every site
gets the same deterministic payload each round; scatter_gather.json records, per round and
site, what came back and whether it echoed the payload; a round short of min_clients fails."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from atoll.fl.app_config import ScatterGatherArgs
from atoll.fl.model import Model
from atoll.fl.workflows.rounds import WorkflowError
from atoll.fl.workflows.scatter_gather import digest, make_payload, run_scatter_gather
from tests.unit.fl.helpers import SiteGone, run_workflow


def echo(topic, model):
    return Model(params=dict(model.params), metrics={"topic_seen": float(topic == "probe")})


def other(topic, model):
    return Model(params={"x": np.ones(3, dtype=np.float32)})


def test_the_payload_is_deterministic_and_has_no_short_period():
    payload = make_payload(600)
    assert payload.dtype == np.uint8 and payload.shape == (600,)
    assert list(payload[:3]) == [0, 1, 2] and payload[250] == 250 and payload[251] == 0
    assert digest(payload) == hashlib.sha256(bytes(payload)).hexdigest()
    assert digest(make_payload(600)) == digest(payload)


def test_each_round_records_every_reply_and_whether_it_echoed(tmp_path):
    args = ScatterGatherArgs(num_rounds=2, payload_bytes=600, topic="probe")
    seen = []

    def watching(topic, model):
        seen.append((topic, model.current_round, digest(model.params["payload"])))
        return echo(topic, model)

    events = run_workflow(run_scatter_gather, args, {"site-1": watching, "site-2": other},
                          tmp_path).events
    report = json.loads((tmp_path / "scatter_gather.json").read_text())
    sent = digest(make_payload(600))
    assert report["sent"] == {"payload": sent}
    assert sorted(seen) == [("probe", 1, sent), ("probe", 2, sent)]
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    for entry in report["rounds"]:
        assert entry["failed"] == {}
        site_1, site_2 = entry["replies"]["site-1"], entry["replies"]["site-2"]
        assert (site_1["echoed"], site_1["params"], site_1["sha256"]) == (
            True, {"payload": 600}, {"payload": sent})
        assert site_1["metrics"] == {"topic_seen": 1.0}
        assert (site_2["echoed"], site_2["params"]) == (False, {"x": 12})
    rounds = [e for e in events if e.get("event") == "round"]
    assert [e["sites"] for e in rounds] == [
        {"site-1": {"echoed": True}, "site-2": {"echoed": False}}] * 2


def test_an_initial_model_is_sent_instead_of_the_payload(tmp_path):
    initial = Model(params={"w": np.arange(4, dtype=np.float64)})
    run_workflow(run_scatter_gather, ScatterGatherArgs(), {"site-1": echo}, tmp_path,
                 initial=initial)
    report = json.loads((tmp_path / "scatter_gather.json").read_text())
    assert report["sent"] == {"w": digest(initial.params["w"])}
    assert report["rounds"][0]["replies"]["site-1"]["echoed"] is True


def test_a_round_short_of_min_clients_fails_after_recording_it(tmp_path):
    def gone(topic, model):
        raise SiteGone("its worker died")

    # site-1's reply may come before or after site-2's drop-out: either way the round fails
    with pytest.raises(WorkflowError, match=r"round 1: [01] site\(s\) returned a usable result, "
                                            r"min_clients is 2\. Failed: .*site-2: site-2 dropped"):
        run_workflow(run_scatter_gather, ScatterGatherArgs(num_rounds=3),
                     {"site-1": echo, "site-2": gone}, tmp_path)
    report = json.loads((tmp_path / "scatter_gather.json").read_text())
    [entry] = report["rounds"]  # written before the round failed; no round 2 was sent
    assert entry["failed"]["site-2"] == "site-2 dropped out: its worker died"
    # site-1 either replied in time or was no longer waited for once the round was lost
    if "site-1" in entry["failed"]:
        assert entry["failed"]["site-1"] == ("not waited for: the round could no longer "
                                             "reach min_clients")
        assert "site-1" not in entry["replies"]
    else:
        assert entry["replies"]["site-1"]["echoed"] is True
