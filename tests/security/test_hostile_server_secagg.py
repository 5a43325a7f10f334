"""Secure aggregation against a hostile server: a job's own workflow class (shipped in the
job, run by the server worker) speaks the protocol to each site alone and tries to unmask one
site's update, on a real local federation (four site parents and a server, mutual TLS, the
process launcher, each site's worker certified by its parent).

Each attack must fail to recover the victim's update, and the site asked to take the unsafe
step refuses, naming the rule (atoll.fl.privacy.secagg.client.RULES). The control: an honest
secure round is still the plain FedAvg of the sites' updates.

Four sites, not three: with three the safe threshold is all three (t > 2n/3), so no share of
anyone's secret is ever enough without every site, whatever the lists; with four (t = 3) a
site's list checks are what stops each attack (the threshold alone would not).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, job_folder

SITES = ["site-1", "site-2", "site-3", "site-4"]
VICTIM = "site-1"
POLICY = """format_version: 1
require: {secure_aggregation: true}
secure_aggregation: {min_participants: 3}
"""
TRAIN = '''
import numpy as np
import atoll.client as fl

fl.init()
k = int(fl.site_name().split("-")[1])
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 1.0}, num_examples=1))
        continue
    delta = 0.01 * k + 0.001 * k * np.arange(16, dtype=np.float32).reshape(4, 4)
    fl.send(fl.Model(params={"w": model.params["w"] + delta}, num_examples=10 * k))
'''
MODEL = '''
import numpy as np

def make():
    return {"w": np.zeros((4, 4), np.float32)}
'''
HOSTILE = Path(__file__).with_name("hostile_secagg_workflow.py").read_text()


def delta(site: str) -> np.ndarray:
    k = int(site.split("-")[1])
    return 0.01 * k + 0.001 * k * np.arange(16, dtype=np.float64).reshape(4, 4)


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), SITES, USERS)
    (fed.kit(VICTIM) / "local" / "privacy.yaml").write_text(POLICY)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _results(session, job: dict, where: Path) -> Path:
    archive = session.download(job["job_id"], where / "download")
    if archive.is_file():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(where / "results")
        return where / "results"
    return archive


def _attack(fed: Federation, tmp_path: Path, attack: str) -> tuple[dict, dict]:
    app = (f"server:\n  workflow: hostile.py:Hostile\n  args: {{attack: {attack}}}\n"
           "  initial_model: model.py:make\nsite:\n  script: train.py\n"
           "privacy:\n  secure_aggregation: {}\n")
    path = job_folder(tmp_path / attack, {"name": attack, "deploy_map": {"app": ["@ALL"]}}, app,
                      {"train.py": TRAIN, "model.py": MODEL, "hostile.py": HOSTILE})
    with fed.session(ADMIN) as s:
        job = s.submit(path, wait=True, timeout=400)
        folder = _results(s, job, tmp_path)
    found = list(folder.rglob("attack.json"))
    assert found, f"the hostile workflow wrote no attack.json: {job}"
    return job, json.loads(found[0].read_text())


def _reason(job: dict, site: str) -> str:
    return str(job["parts"][site].get("reason", ""))


def _not_learned(outcome: dict) -> None:
    recovered = outcome["recovered"]
    assert recovered is None or not np.allclose(recovered["w"], delta(VICTIM), atol=1e-4), \
        "the hostile workflow unmasked the victim's update"
    assert recovered is None, outcome


def test_an_honest_secure_round_is_the_plain_fedavg_of_the_updates(fed, tmp_path):
    app = ("server:\n  workflow: fedavg\n  args: {num_rounds: 1, round_timeout: 120, "
           "evaluate_every: 0, cross_site_eval: none}\n  initial_model: model.py:make\n"
           "site:\n  script: train.py\nprivacy:\n  secure_aggregation: {}\n")
    path = job_folder(tmp_path / "honest", {"name": "honest", "deploy_map": {"app": ["@ALL"]}},
                      app, {"train.py": TRAIN, "model.py": MODEL})
    with fed.session(ADMIN) as s:
        job = s.submit(path, wait=True, timeout=400)
        assert job["state"] == "FINISHED:COMPLETED", job
        folder = _results(s, job, tmp_path)
    from atoll.fl.serde import load_file

    final = load_file(next(folder.rglob("global_model_final.safetensors"))).params["w"]
    weights = {s: 10 * int(s.split("-")[1]) for s in SITES}
    expected = sum(weights[s] * delta(s) for s in SITES) / sum(weights.values())
    # fixed point: 2**-24 per entry and site before the division, then float32
    np.testing.assert_allclose(final, expected, rtol=0, atol=1e-6)


def test_a_site_told_to_mask_with_nobody_but_itself_refuses(fed, tmp_path):
    job, outcome = _attack(fed, tmp_path, "self_only")
    _not_learned(outcome)
    assert "secure aggregation rule participant-sets" in _reason(job, VICTIM)
    assert "the sites to mask with has 1 site(s), fewer than the threshold 3" in \
        _reason(job, VICTIM)


def test_sites_told_different_survivor_lists_refuse(fed, tmp_path):
    job, outcome = _attack(fed, tmp_path, "different_lists")
    _not_learned(outcome)
    for site in SITES:  # each was shown a survivor set smaller than the threshold
        assert "secure aggregation rule participant-sets" in _reason(job, site), site
    assert outcome["revealed"] == {}


def test_a_second_request_for_the_other_share_of_a_peer_is_refused(fed, tmp_path):
    job, outcome = _attack(fed, tmp_path, "both_shares")
    _not_learned(outcome)
    for site in SITES[1:]:  # asked for the victim's key shares after its self-mask shares
        assert "secure aggregation rule one-share-per-peer" in _reason(job, site), site
        assert outcome["revealed"][site]["s"] == []


def test_a_peer_moved_from_survived_to_dropped_is_refused(fed, tmp_path):
    job, outcome = _attack(fed, tmp_path, "moved_peer")
    _not_learned(outcome)
    # site-4 is first asked with the victim moved: it refuses, its lists were signed otherwise
    reason = _reason(job, "site-4")
    assert "secure aggregation rule consistent-lists" in reason
    assert f"moves ['{VICTIM}'] between survived and dropped" in reason
    for site in ("site-2", "site-3"):  # asked again: they answer once
        assert "secure aggregation rule one-share-per-peer" in _reason(job, site), site
    assert set(outcome["revealed"]) == set(SITES[:3])
    assert all(r["s"] == [] for r in outcome["revealed"].values())


def test_a_threshold_below_the_safe_bound_is_refused(fed, tmp_path):
    job, outcome = _attack(fed, tmp_path, "low_threshold")
    _not_learned(outcome)
    for site in SITES:
        assert "secure aggregation rule safe-threshold" in _reason(job, site), site
        assert "threshold 2 for 4 sites; it must be between 3 and 4" in _reason(job, site)


def test_key_advertisements_the_server_made_for_other_sites_are_refused(fed, tmp_path):
    job, outcome = _attack(fed, tmp_path, "impersonate")
    _not_learned(outcome)
    reason = _reason(job, VICTIM)
    assert "secure aggregation rule authenticated-peers" in reason
    assert "was not issued by this project's CA" in reason
