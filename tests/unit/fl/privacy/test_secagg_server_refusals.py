"""The server side of secure aggregation refuses what would break its promise, at the entry point
that folds each reply (``SecureRound.add_masked``): a result that is not masked (it would be one
site's update in the clear in the server's memory), and a masked result whose names or shapes
differ from the others' (it would corrupt the sum, or fold into the wrong entries). A refused
reply leaves the running sum as it was."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.aggregation import ResultRejected
from atoll.fl.model import Model
from atoll.fl.privacy.secagg import masking
from atoll.fl.privacy.secagg.identity import LocalAuthority
from atoll.fl.privacy.secagg.server import SecureRound
from atoll.fl.serde import encode, open_model

AUTHORITY = LocalAuthority("tests")  # the sites' certified keys (a site requires one)


def _round() -> SecureRound:
    # add_masked never talks to the sites: no channel is needed to fold replies
    return SecureRound(channel=None, round_=1, headers={}, timeout=None, min_clients=2)


def _reply(params: dict[str, np.ndarray]):
    return open_model(encode(Model(params=params, num_examples=1)))


def _masked(**shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out = {name: rng.integers(0, 2**63, size=shape, dtype=np.uint64)
           for name, shape in shapes.items()}
    out[masking.WEIGHT] = np.array([3], np.uint64)
    return out


def test_a_plain_float_result_is_refused_as_unmasked():
    secure = _round()
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("a", _reply({"w": np.ones(4, np.float32)}))
    assert secure._sum == {} and secure._masked == []


def test_a_uint64_result_without_the_weight_entry_is_refused_as_unmasked():
    secure = _round()
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("a", _reply({"w": np.ones(4, np.uint64)}))
    assert secure._sum == {} and secure._masked == []


def test_a_masked_result_of_another_shape_is_refused_and_the_sum_kept():
    secure = _round()
    first = _masked(w=(4,))
    secure.add_masked("a", _reply(first))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(w=(5,))))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(w=(2, 2))))
    assert secure._masked == ["a"]
    assert np.array_equal(secure._sum["w"], first["w"])


def test_a_masked_result_with_other_names_is_refused():
    secure = _round()
    secure.add_masked("a", _reply(_masked(w=(4,))))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(w=(4,), extra=(1,))))
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(_masked(v=(4,))))
    assert secure._masked == ["a"]


def test_matching_masked_results_fold_modulo_two_to_the_64():
    secure = _round()
    first, second = _masked(w=(4,)), _masked(w=(4,))
    secure.add_masked("a", _reply(first))
    secure.add_masked("b", _reply(second))
    assert secure._masked == ["a", "b"]
    assert np.array_equal(secure._sum["w"], first["w"] + second["w"])  # uint64 wraps


# --- the setup and unmask steps, with the sites' answers given directly -----------------------

def _keys(*sites: str) -> dict[str, dict[str, bytes]]:
    from atoll.fl.privacy.secagg.client import ADVERTISE, SecAggClient, unb64

    out = {}
    for site in sites:
        meta = SecAggClient(site, "job", AUTHORITY.identity(site, "job")).answer(ADVERTISE, 1, {})
        out[site] = {"c": unb64(meta["c"], "c"), "s": unb64(meta["s"], "s")}
    return out


def test_a_threshold_above_the_sites_that_advertised_is_refused():
    from atoll.fl.privacy.secagg.client import ADVERTISE, SecAggClient
    from atoll.fl.workflows import WorkflowError

    secure = SecureRound(channel=None, round_=1, headers={}, timeout=None, min_clients=2,
                         threshold=3)

    def step(targets, topic, meta, need):
        assert topic == ADVERTISE, "the round went on to share its keys"
        return {site: SecAggClient(site, "job", AUTHORITY.identity(site, "job")).answer(ADVERTISE, 1, {}) for site in targets}

    secure._step = step
    with pytest.raises(WorkflowError, match="threshold is 3 but only 2 site"):
        secure.setup(["a", "b"])


def _unmasking(answers: dict[str, dict], dropped: str | None = None) -> SecureRound:
    secure = SecureRound(channel=None, round_=1, headers={}, timeout=None, min_clients=2,
                         threshold=2)
    secure.keys = _keys("a", "b", "c")
    secure.sites = ["a", "b", "c"]
    secure._masked = [s for s in secure.sites if s != dropped]
    secure._sum = _masked(w=(4,))
    from atoll.fl.privacy.secagg.client import CHECK

    def step(targets, topic, meta, need):  # the consistency check first, then the unmask
        return {site: {"sig": "signed"} for site in targets} if topic == CHECK else answers

    secure._step = step
    return secure


def test_too_few_shares_of_a_secret_are_refused():
    from atoll.fl.workflows import WorkflowError

    secure = _unmasking({"a": {"b": {}, "s": {}}, "b": {"b": {}, "s": {}}, "c": {"b": {}, "s": {}}})
    with pytest.raises(WorkflowError, match="only 0 share\\(s\\) of a's secret came back, 2 needed"):
        secure.unmask()


def test_shares_that_do_not_rebuild_a_dropped_sites_mask_key_are_refused():
    from atoll.fl.privacy.secagg import shamir
    from atoll.fl.workflows import WorkflowError

    points = {"a": 1, "b": 2, "c": 3}
    seeds = {site: shamir.split(bytes([i + 1]) * 32, [1, 2, 3], 2)
             for i, site in enumerate(("a", "b"))}
    wrong_key = shamir.split(bytes(range(32)), [1, 2, 3], 2)  # not c's mask key
    answers = {holder: {"b": {site: format(seeds[site][points[holder]], "x")
                              for site in ("a", "b")},
                        "s": {"c": format(wrong_key[points[holder]], "x")}}
               for holder in ("a", "b")}
    secure = _unmasking(answers, dropped="c")
    with pytest.raises(WorkflowError, match="the shares of c's mask key do not rebuild it"):
        secure.unmask()


def test_a_step_that_gathered_fewer_answers_than_it_needs_goes_no_further(monkeypatch):
    """Whatever the gathering returned (a site gone quiet, an answer dropped), a step never
    goes on with fewer answers than the threshold and min_clients need."""
    from types import SimpleNamespace

    from atoll.fl.privacy.secagg import server
    from atoll.fl.privacy.secagg.client import ADVERTISE
    from atoll.fl.serde import ModelStream
    from atoll.fl.workflows import WorkflowError

    class Channel:
        job_id = "job"

        def send(self, targets, topic, headers, chunks):
            return "task"

    def gather(channel, task, targets, timeout, take, need):  # only a answered; none failed
        take("a", ModelStream(encode(Model(meta={"c": "c", "s": "s", "cred": {}, "sig": "x"}))))
        return SimpleNamespace(failed={})

    monkeypatch.setattr(server, "gather", gather)
    secure = SecureRound(channel=Channel(), round_=1, headers={}, timeout=None, min_clients=2)
    with pytest.raises(WorkflowError, match=r"\(secagg.advertise\): 1 site\(s\) answered, 2 needed"):
        secure._step(["a", "b"], ADVERTISE, {}, 2)
    assert set(secure._step(["a"], ADVERTISE, {}, 1)) == {"a"}  # the control


def test_a_masked_result_of_other_word_widths_or_a_bad_weight_entry_is_refused():
    secure = _round()
    first = _masked(w=(4,))
    secure.add_masked("a", _reply(first))
    narrow = {"w": first["w"].astype(np.uint32), masking.WEIGHT: first[masking.WEIGHT]}
    with pytest.raises(ResultRejected, match="names or shapes differ"):
        secure.add_masked("b", _reply(narrow))  # 32-bit words where the others sent 64
    wide_weight = {**narrow, masking.WEIGHT: np.array([3, 3], np.uint64)}
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("c", _reply(wide_weight))
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("c", _reply({**narrow, masking.WEIGHT: np.array([3], np.uint32)}))
    assert secure._masked == ["a"] and np.array_equal(secure._sum["w"], first["w"])


def test_32_bit_masked_results_fold_modulo_two_to_the_32():
    secure = _round()
    rng = np.random.default_rng(3)
    first, second = ({"w": rng.integers(0, 2**32, 6, dtype=np.uint32),
                      masking.WEIGHT: np.array([1], np.uint64)} for _ in range(2))
    secure.add_masked("a", _reply(first))
    secure.add_masked("b", _reply(second))
    assert secure._sum["w"].dtype == np.uint32
    assert np.array_equal(secure._sum["w"], first["w"] + second["w"])  # uint32 wraps
