"""Secure aggregation: the server's result is FedAvg's, and the server never holds one site's
update; sites that leave after masking (or before) are recovered.

The probe instruments the server side: every reply's bytes as the server channel hands them
to the workflow (everything the server learns arrives there), every array in and out of the
aggregation entry points (``SecureRound.add_masked``/``unmask``, ``WeightedMean``), every array
reachable from the workflow and the secure round after each fold and around each round's end
(the server's memory, short of the channel), and every log line. The same probe on plain FedAvg finds every site's update: the attack it guards
against, shown to succeed without the defence.
"""

from __future__ import annotations

import logging
import threading
import types
from dataclasses import dataclass, field

import numpy as np
import pytest

from atoll.fl.aggregation import WeightedMean
from atoll.fl.model import Model
from atoll.fl.privacy.secagg import masking
from atoll.fl.privacy.secagg.server import SecureRound
from atoll.fl.serde import decode, encode, load_file
from atoll.fl.simulator import Federation, InMemoryServerChannel
from atoll.fl.workflows import WorkflowError
from atoll.fl.workflows.fedavg import FedAvgRun
from atoll.spec.privacy import PrivacySettings

from .sites import adds, run_private

INITIAL = {"layer.weight": np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6),
           "layer.bias": np.zeros(6, np.float32)}
EXAMPLES = {"a": 10, "b": 25, "c": 40, "d": 5}
SECURE = PrivacySettings.model_validate({"secure_aggregation": {}})  # t = 3 of 4: one may leave


def _deltas() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(42)
    return {site: {k: rng.normal(0, 0.1, v.shape).astype(np.float32) for k, v in INITIAL.items()}
            for site in EXAMPLES}


def _fedavg(sites, deltas, rounds=1):
    """Plain FedAvg of sites that each add their delta, computed here."""
    weights = sum(EXAMPLES[s] for s in sites)
    model = {k: v.astype(np.float64) for k, v in INITIAL.items()}
    for _ in range(rounds):
        model = {k: v + sum(EXAMPLES[s] * deltas[s][k] for s in sites) / weights
                 for k, v in model.items()}
    return model


@dataclass
class Probe:
    payloads: list[bytes] = field(default_factory=list)
    arrays: list[np.ndarray] = field(default_factory=list)
    caplog: pytest.LogCaptureFixture | None = None

    @property
    def logs(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records] if self.caplog else []

    def holds(self, site_delta: dict[str, np.ndarray], global_before: dict[str, np.ndarray],
              n: int) -> list[str]:
        """Where the probe saw this site's own update (as weights, diff or encoded)."""
        seen = []
        for name, delta in site_delta.items():
            forms = {"weights": (global_before[name] + delta).astype(np.float32),
                     "diff": delta.astype(np.float32),
                     "encoded": masking.encode({name: delta}, n, 3)[name]}
            for form, value in forms.items():
                if value.nbytes >= 16 and any(value.tobytes() in p for p in self.payloads):
                    seen.append(f"{name} {form} in a reply's bytes")
            for array in self.arrays:
                for form, value in forms.items():
                    if array.shape != value.shape:
                        continue
                    if form == "encoded" or array.dtype.kind == "u":
                        if array.dtype == value.dtype and np.array_equal(array, value):
                            seen.append(f"{name} {form} in the server's memory")
                        continue
                    for scale in (1.0, float(n)):
                        if np.allclose(array, value.astype(np.float64) * scale, atol=1e-4):
                            seen.append(f"{name} {form} (x{scale:g}) in an aggregation array")
            text = f"{float(delta.ravel()[0]):.4f}"
            seen += [f"{name} in a log line" for line in self.logs if text in line]
        return seen


@pytest.fixture
def probe(monkeypatch, caplog):
    found = Probe(caplog=caplog)
    caplog.set_level(logging.DEBUG, logger="atoll")
    replies = Federation.replies

    def recorded_replies(self, task_id, timeout):
        for reply in replies(self, task_id, timeout):
            if reply.chunks is not None:
                chunks = [bytes(c) for c in reply.chunks]
                found.payloads.append(b"".join(chunks))
                reply.chunks = iter(chunks)
            yield reply

    def recorded(method, take):
        def wrapper(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            take(self, args, result)
            return result
        return wrapper

    def keep_sum(self, args, result):
        found.arrays += [np.asarray(a, np.float64) for a in result[0].values()]

    def keep_state(self, args, result):
        found.arrays += [a.view(np.int64).astype(np.float64) for a in self._sum.values()]

    def keep_mean(self, args, result):
        found.arrays += [np.asarray(a, np.float64) for a in self._sum.values()]

    def keep_reachable(self, args, result):  # the workflow's and the secure round's memory
        found.arrays += reachable_arrays(self)

    monkeypatch.setattr(Federation, "replies", recorded_replies)
    monkeypatch.setattr(SecureRound, "unmask", recorded(SecureRound.unmask, keep_sum))
    monkeypatch.setattr(WeightedMean, "add_stream", recorded(WeightedMean.add_stream, keep_mean))
    finish = recorded(FedAvgRun._finish_round, keep_reachable)

    def finish_scanned(self, *args):  # before and after the new global model is made
        keep_reachable(self, args, None)
        return finish(self, *args)

    monkeypatch.setattr(FedAvgRun, "_finish_round", finish_scanned)
    fold = SecureRound.add_masked

    def fold_scanned(self, *args):
        result = fold(self, *args)
        keep_state(self, args, result)
        keep_reachable(self, args, result)
        return result

    monkeypatch.setattr(SecureRound, "add_masked", fold_scanned)
    return found


def reachable_arrays(root: object) -> list[np.ndarray]:
    """Every numpy array reachable from ``root`` through attributes and containers, short of
    the channel (its queues hold what the simulated sites hold, not the server)."""
    seen, stack, arrays = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, Federation | InMemoryServerChannel | type
                                         | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            arrays.append(obj.astype(np.float64) if obj.dtype.kind == "f" else obj.copy())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return arrays


def _final(results):
    return load_file(results / "global_model_final.safetensors").params


def test_the_secure_sum_is_fedavg_and_the_server_never_holds_one_update(tmp_path, probe):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}
    run_private(SECURE, trainers, tmp_path, INITIAL, rounds=1)
    expected = _fedavg(EXAMPLES, deltas)
    for name, value in _final(tmp_path).items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6)
    assert probe.payloads and probe.arrays  # the probe did see the server's traffic
    assert any(a.dtype == np.uint32 and a.shape == INITIAL["layer.weight"].shape
               for a in probe.arrays)  # and the masked sum (32-bit words) in its memory
    assert any("round 1" in line for line in probe.logs)  # the probe reads the server's log
    for site in EXAMPLES:
        assert probe.holds(deltas[site], INITIAL, EXAMPLES[site]) == [], site


def test_without_secure_aggregation_the_same_probe_finds_every_update(tmp_path, probe):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}
    run_private(None, trainers, tmp_path, INITIAL, rounds=1)
    for site in EXAMPLES:
        assert any("weights in a reply's bytes" in w
                   for w in probe.holds(deltas[site], INITIAL, EXAMPLES[site])), site


def test_a_site_leaving_after_sending_its_masked_update_is_recovered(tmp_path, probe):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}
    federation, errors = run_private(SECURE, trainers, tmp_path, INITIAL, rounds=2,
                                     min_clients=3, leave_after_send={"c": 1})
    assert errors == {"c": "Leave: left after sending round 1"}
    # round 1: all four in the sum (c's self-mask rebuilt from the others' shares); round 2:
    # a, b, d (3 sites: the safe threshold is 3 again, all of them)
    after_0 = _fedavg(EXAMPLES, deltas)
    rest = ("a", "b", "d")
    weights = sum(EXAMPLES[s] for s in rest)
    expected = {k: v + sum(EXAMPLES[s] * deltas[s][k] for s in rest) / weights
                for k, v in after_0.items()}
    for name, value in _final(tmp_path).items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6)
    rounds = [e for e in federation.events if e["event"] == "round"]
    assert "c" in rounds[0]["failed"] and rounds[1]["active"] == ["a", "b", "d"]
    for site in EXAMPLES:
        assert probe.holds(deltas[site], INITIAL, EXAMPLES[site]) == [], site


def test_a_site_leaving_after_sharing_but_before_masking_is_recovered(tmp_path, probe):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}

    def leaves(model: Model) -> Model:
        raise RuntimeError("worker killed before it trained")

    trainers["c"] = leaves
    run_private(SECURE, trainers, tmp_path, INITIAL, rounds=1, min_clients=3)
    # c's pairwise masks sit in the others' updates: rebuilt from the shares of its mask key
    expected = _fedavg(["a", "b", "d"], deltas)
    for name, value in _final(tmp_path).items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6)
    for site in ("a", "b", "d"):
        assert probe.holds(deltas[site], INITIAL, EXAMPLES[site]) == [], site


def test_a_site_without_secure_aggregation_in_its_app_is_rejected_naming_why(tmp_path):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}
    federation = Federation(list(EXAMPLES), tmp_path)
    plain = {"c"}  # c's app.yaml has no privacy: its script gets the protocol's tasks

    def script_only(site: str) -> None:  # answers every task with weights, as a script would
        channel = federation.site_channel(site)
        while (task := channel.receive()) is not None:
            model = decode(task.chunks)
            channel.reply(task.task_id, {}, encode(Model(
                params={k: v + 1 for k, v in model.params.items()} or {"x": np.ones(1)},
                num_examples=1)))

    thread = threading.Thread(target=script_only, args=("c",), daemon=True)
    thread.start()
    with pytest.raises(WorkflowError) as failed:
        run_private(SECURE, {s: t for s, t in trainers.items() if s not in plain}, tmp_path,
                    INITIAL, rounds=1, min_clients=4, federation=federation)
    assert "c: answered secagg.advertise without ['c', 'cred', 's', 'sig']: the site's app.yaml must turn on " \
           "privacy.secure_aggregation too" in str(failed.value)


def test_a_site_past_its_share_of_max_sum_refuses_naming_the_key_and_the_round_goes_on(
        tmp_path):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}
    big = {k: np.full_like(v, 200.0) for k, v in deltas["d"].items()}  # 5 x 200 > 100 / 4
    trainers["d"] = adds(big, EXAMPLES["d"])
    settings = PrivacySettings.model_validate({"secure_aggregation": {"max_sum": 100}})
    _, errors = run_private(settings, trainers, tmp_path, INITIAL, rounds=1, min_clients=3)
    assert set(errors) == {"d"}
    assert "privacy.secure_aggregation.max_sum (100 for 4 sites)" in errors["d"], errors
    expected = _fedavg(["a", "b", "c"], deltas)  # d shared its keys, never masked: recovered
    for name, value in _final(tmp_path).items():  # a finer step than the default's
        np.testing.assert_allclose(value, expected[name], atol=1e-6)


def test_word_bits_64_sends_64_bit_words_and_sums_as_exactly(tmp_path, probe):
    deltas = _deltas()
    trainers = {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}
    settings = PrivacySettings.model_validate({"secure_aggregation": {"word_bits": 64}})
    run_private(settings, trainers, tmp_path, INITIAL, rounds=1)
    expected = _fedavg(EXAMPLES, deltas)
    for name, value in _final(tmp_path).items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6)
    shape = INITIAL["layer.weight"].shape
    assert any(a.dtype == np.uint64 and a.shape == shape for a in probe.arrays)
    assert not any(a.dtype == np.uint32 for a in probe.arrays)


def test_a_secure_rounds_key_steps_go_out_while_the_last_checkpoint_is_written(tmp_path,
                                                                                monkeypatch):
    """The key and share steps and the train task change no array of the checkpoint's state:
    they go out while the last round's checkpoint is still written (0.1-0.2 s for 100 MiB),
    and only the first masked reply waits for it."""
    from atoll.fl.simulator import Federation
    from atoll.fl.workflows.api import Context

    events: list[str] = []
    real_checkpoint, real_settle, real_send = (Context.checkpoint, Context.settle_checkpoint,
                                               Federation.send)

    def checkpoint(self, round, *args, **kwargs):  # noted once its write has started
        real_checkpoint(self, round, *args, **kwargs)
        events.append(f"checkpoint {round}")

    def settle(self):
        events.append("settle")
        return real_settle(self)

    def send(self, targets, topic, headers, payload):
        events.append(f"send {topic}")
        return real_send(self, targets, topic, headers, payload)

    monkeypatch.setattr(Context, "checkpoint", checkpoint)
    monkeypatch.setattr(Context, "settle_checkpoint", settle)
    monkeypatch.setattr(Federation, "send", send)
    deltas = _deltas()
    run_private(SECURE, {s: adds(deltas[s], EXAMPLES[s]) for s in EXAMPLES}, tmp_path, INITIAL,
                rounds=2)
    after = events[events.index("checkpoint 1") + 1:]
    meanwhile = after[:after.index("settle")]
    assert meanwhile == ["send secagg.advertise", "send secagg.share", "send train"], events
    for name, value in _final(tmp_path).items():
        np.testing.assert_allclose(value, _fedavg(EXAMPLES, deltas, rounds=2)[name], atol=1e-6)
