"""DP across a server restart (issue 37): the job's epsilon never resets and each site's privacy
ledger keeps what it spent before the restart. The real FedAvg workflow, the real checkpoint and
the runner's resume path, with sites on the real client runtime (``ClientSession`` with
``SitePrivacy``, client-mode DP) whose ledger has the site parent's arithmetic (the simulator's
``MemoryLedger``). The server dies while round 4's noised replies arrive; the sites, as real
site workers do, outlive it and answer the resumed server's round 4 again."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from atoll.fl.app_config import FedAvgArgs
from atoll.fl.client_runtime import ClientSession, bind, unbind
from atoll.fl.model import Model
from atoll.fl.privacy.accounting import epsilon
from atoll.fl.privacy.site_privacy import SitePrivacy
from atoll.fl.runner import _resume
from atoll.fl.simulator import Federation
from atoll.fl.workflows import FedAvg
from atoll.fl.workflows.api import Context
from atoll.spec.privacy import PrivacySettings

from .sites import AUTHORITY, adds

ROUNDS, NOISE, DELTA = 6, 1.0, 1e-5
SETTINGS = PrivacySettings.model_validate({"dp": {"clip_norm": 10.0, "noise_multiplier": NOISE,
                                                  "delta": DELTA}})
ARGS = FedAvgArgs(num_rounds=ROUNDS, evaluate_every=0, cross_site_eval="none", round_timeout=60)


class _Killed(Exception):
    pass


class _DiesInRound:
    """The server channel of a server that is killed once every reply of ``round_``'s train
    task has arrived: the sites released their noised updates, the server aggregated nothing."""

    def __init__(self, channel, round_: int):
        self._channel, self._round, self._doomed = channel, round_, None

    def __getattr__(self, name):
        return getattr(self._channel, name)

    def send(self, targets, topic, headers, payload):
        task_id = self._channel.send(targets, topic, headers, payload)
        if topic == "train" and headers.get("round") == self._round:
            self._doomed = task_id
        return task_id

    def replies(self, task_id, timeout=None):
        if task_id != self._doomed:
            return self._channel.replies(task_id, timeout)
        assert len(list(self._channel.replies(task_id, timeout))) == 2
        raise _Killed


def _server(federation, folder, resume=None, dies_in=None):
    """One server worker's run of the job (fl/runner.py's path), on ``federation``."""
    channel = federation.server_channel()
    channel.checkpoint_dir = folder / "checkpoint"
    if dies_in is not None:
        channel = _DiesInRound(channel, dies_in)
    ctx = Context(channel, ARGS, Model(params={"w": np.zeros(3, np.float32)}),
                  {"privacy": SETTINGS, "resume": resume})
    workflow = FedAvg(ctx)
    if resume is not None:
        _resume(workflow, ctx, resume)
    try:
        workflow.run()
    finally:
        ctx.close()


def _job(folder, kill_in=None):
    """The job from submit to end, the server killed once in round ``kill_in`` and resumed;
    the site sessions live through it. (federation, the sites' errors)."""
    federation = Federation(["a", "b"], folder)
    errors: dict[str, str] = {}

    def site(name: str) -> None:
        privacy = SitePrivacy(SETTINGS, None, name, federation.job_id,
                              identity=AUTHORITY.identity(name, federation.job_id))
        session = ClientSession(federation.site_channel(name), name, privacy=privacy)
        bind(session, thread_only=True)
        train = adds({"w": np.ones(3, np.float32)}, 5)
        try:
            while (model := session.receive()) is not None:
                session.send(train(model))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            errors[name] = f"{type(exc).__name__}: {exc}"
        finally:
            unbind(thread_only=True)

    threads = [threading.Thread(target=site, args=(s,), daemon=True) for s in federation.sites]
    for thread in threads:
        thread.start()
    try:
        if kill_in is None:
            _server(federation, folder)
        else:
            with pytest.raises(_Killed):
                _server(federation, folder, dies_in=kill_in)
            spent_before = {s: federation.ledger.ledgers[s].total("dp")[0] for s in ("a", "b")}
            _server(federation, folder, resume={"attempt": 1, "round": kill_in - 1})
            federation.spent_before = spent_before
    finally:
        federation.close()
        for thread in threads:
            thread.join(timeout=30)
    return federation, errors


def _privacy_rows(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(r["round"], r["metrics"]["epsilon"]) for r in rows if r["phase"] == "privacy"]


def test_the_jobs_epsilon_goes_on_from_the_checkpoint_and_never_resets(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    _, errors = _job(whole)
    assert errors == {}
    federation, errors = _job(cut, kill_in=4)
    assert errors == {}
    # the job's ledger (the server's): the rounds aggregated, each once, as uninterrupted
    expected = [(r, pytest.approx(epsilon(NOISE, r, DELTA))) for r in range(1, ROUNDS + 1)]
    assert _privacy_rows(whole) == expected
    assert _privacy_rows(cut) == expected  # round 4 once, and 5 on from 4's epsilon, not 1's
    for folder in (whole, cut):
        summary = json.loads((folder / "summary.json").read_text())["privacy"]
        assert summary["rounds"] == ROUNDS
        assert summary["epsilon"] == pytest.approx(epsilon(NOISE, ROUNDS, DELTA))
        assert summary["epsilon_per_round"] == pytest.approx(
            [epsilon(NOISE, r, DELTA) for r in range(1, ROUNDS + 1)])


def test_a_sites_ledger_keeps_what_it_spent_before_the_restart(tmp_path):
    federation, errors = _job(tmp_path, kill_in=4)
    assert errors == {}
    for site in ("a", "b"):
        # before the kill: rounds 1-3 and round 4's lost reply, four releases
        assert federation.spent_before[site] == pytest.approx(epsilon(NOISE, 4, DELTA))
        # after: those four and rounds 4-6 of the resumed run; nothing forgotten or reset
        spent, _, jobs = federation.ledger.ledgers[site].total("dp")
        assert jobs == 1 and spent == pytest.approx(epsilon(NOISE, ROUNDS + 1, DELTA))
    sent = [e["sites"]["a"]["train"]["privacy_epsilon"] for e in federation.events
            if e.get("event") == "round"]
    assert sent == pytest.approx([epsilon(NOISE, k, DELTA) for k in (1, 2, 3, 5, 6, 7)])
