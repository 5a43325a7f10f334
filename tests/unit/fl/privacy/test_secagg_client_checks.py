"""A site's checks of what a hostile server hands it in secure aggregation (client.py RULES),
and the server's exactness checks of the masked replies (server.py ``add_masked``).

The protocol runs by hand here: real SecAggClients with site-certified keys from a throwaway
CA, and the test playing the server, honestly first (the positive control: the unmasked sum
is exactly the sum of the inputs), then breaking one rule at a time. Each hostile step must be
refused naming its rule, before the site reveals anything.
"""

from __future__ import annotations

import numpy as np
import pytest

from atoll.fl.aggregation import ResultRejected
from atoll.fl.model import Model
from atoll.fl.privacy.secagg import crypto, masking, shamir
from atoll.fl.privacy.secagg.client import (
    ADVERTISE,
    CHECK,
    SHARE,
    UNMASK,
    SecAggClient,
    SecAggRefused,
    add_masks,
    check_text,
    mask_info,
    safe_threshold,
)
from atoll.fl.privacy.secagg.identity import CredentialError, LocalAuthority, check
from atoll.fl.privacy.secagg.server import SecureRound
from atoll.fl.serde import ModelStream, encode

JOB = "job-1"
AUTHORITY = LocalAuthority("tests")
SITES = ("a", "b", "c")
INPUTS = {s: np.arange(6, dtype=np.int64) * (i + 1) - 7 for i, s in enumerate("abcdefg")}


class Server:
    """The test as the server: runs each step over the clients, one request per site."""

    def __init__(self, sites=SITES, min_participants=None, round_=1):
        self.round = round_
        self.clients = {s: SecAggClient(s, JOB, AUTHORITY.identity(s, JOB), min_participants)
                        for s in sites}
        self.adverts = {s: c.answer(ADVERTISE, round_, {}) for s, c in self.clients.items()}

    def share(self, threshold=None, keys=None, to=None):
        threshold = threshold or safe_threshold(len(self.clients))
        keys = keys or self.adverts
        self.shares = {s: self.clients[s].answer(SHARE, self.round,
                                                 {"keys": keys, "threshold": threshold})["shares"]
                       for s in (to or self.clients)}
        return self.shares

    def train(self, sites_for=None):
        """Each site takes its shares (``sites_for[site]``: the list it is told) and masks."""
        self.masked = {}
        for site, client in self.clients.items():
            sites = (sites_for or {}).get(site, sorted(self.clients))
            client.take_shares(self.round, {"sites": sites, "shares": {
                site: {u: self.shares[u][site] for u in self.shares}}})
            words = {"x": INPUTS[site].astype(np.int64).view(np.uint64).copy()}
            self.masked[site] = client.mask(self.round, words)["x"]

    def check(self, survivors, dropped, to=None):
        return {s: self.clients[s].answer(CHECK, self.round,
                                          {"survivors": survivors, "dropped": dropped})["sig"]
                for s in (to or survivors)}

    def unmask(self, site, survivors, dropped, signatures):
        return self.clients[site].answer(UNMASK, self.round, {
            "survivors": survivors, "dropped": dropped, "signatures": signatures})


def _refused(rule: str):
    return pytest.raises(SecAggRefused, match=f"rule {rule} ")


def test_an_honest_round_unmasks_exactly_the_sum_of_the_inputs():
    server = Server()
    server.share()
    server.train()
    sites = sorted(SITES)
    signatures = server.check(sites, [])
    answers = {s: server.unmask(s, sites, [], signatures) for s in sites}
    point = {s: i + 1 for i, s in enumerate(sites)}
    total = {"x": sum(server.masked.values()).astype(np.uint64)}  # modulo 2**64
    seeds = [(shamir.combine([(point[h], int(a["b"][owner], 16)) for h, a in answers.items()]), -1)
             for owner in sites]
    add_masks(total, seeds)
    assert np.array_equal(total["x"].view(np.int64), sum(INPUTS[s] for s in sites))
    assert all(a["s"] == {} for a in answers.values())  # no key share of a survivor


def test_the_default_and_the_safe_threshold_are_more_than_two_thirds():
    assert [safe_threshold(n) for n in range(2, 8)] == [2, 3, 3, 4, 5, 5]
    for n in range(2, 30):
        assert safe_threshold(n) > 2 * n / 3 and safe_threshold(n) - 1 <= max(1, 2 * n / 3)


def test_a_threshold_below_the_safe_bound_is_refused():
    server = Server()
    with _refused("safe-threshold"):
        server.share(threshold=2)  # 2 of 3: the reported default, a majority
    with _refused("safe-threshold"):
        Server(round_=2).share(threshold=4)  # more than the sites: nobody could unmask


def test_fewer_sites_than_the_sites_minimum_is_refused():
    with _refused("min-participants"):
        Server(min_participants=4).share()
    Server(min_participants=3).share()  # exactly the minimum is fine


def test_a_key_advertisement_the_site_did_not_sign_is_refused():
    server = Server()
    forged = dict(server.adverts)
    fake = SecAggClient("b", JOB, LocalAuthority("tests").identity("b", JOB))  # another CA
    forged["b"] = fake.answer(ADVERTISE, 1, {})
    with _refused("authenticated-peers"):
        server.share(keys=forged, to=["a"])


def test_a_site_credential_used_for_another_site_or_job_is_refused():
    server = Server()
    forged = dict(server.adverts)
    forged["b"] = server.adverts["c"]  # c's genuine, signed advertisement, passed off as b's
    with _refused("authenticated-peers"):
        server.share(keys=forged, to=["a"])
    server = Server(round_=2)
    swapped = dict(server.adverts)
    swapped["b"] = {**server.adverts["b"], "s": server.adverts["c"]["s"]}  # b's keys changed
    with _refused("authenticated-peers"):
        server.share(keys=swapped, to=["a"])
    other_job = AUTHORITY.identity("b", "job-2").credential
    with pytest.raises(CredentialError, match="another job"):
        check(other_job, AUTHORITY.ca_pem(), JOB, "b")


def test_masking_with_only_itself_or_with_unkeyed_sites_is_refused():
    server = Server()
    server.share()
    with _refused("participant-sets"):
        server.train(sites_for={"a": ["a"]})  # the reported attack: a masks with nobody
    server = Server(round_=2)
    server.share()
    with _refused("participant-sets"):
        server.train(sites_for={"a": ["a", "b", "z"]})


def test_survivors_fewer_than_the_threshold_are_refused_before_anything_is_revealed():
    server = Server()
    server.share()
    server.train()
    with _refused("participant-sets"):
        server.check(["a"], ["b", "c"], to=["a"])


def test_different_lists_for_different_sites_fail_the_consistency_check():
    server = Server(sites=("a", "b", "c", "d"))
    server.share()  # threshold 3 of 4
    server.train()
    signatures = {**server.check(["a", "b", "c", "d"], [], to=["a", "b"]),
                  **server.check(["b", "c", "d"], ["a"], to=["c", "d"])}
    with _refused("consistent-lists"):
        server.unmask("b", ["a", "b", "c", "d"], [], signatures)
    with _refused("consistent-lists"):
        server.unmask("c", ["b", "c", "d"], ["a"], signatures)


def test_too_few_signatures_or_none_are_refused():
    server = Server()
    server.share()
    server.train()
    sites = sorted(SITES)
    signatures = server.check(sites, [])
    with _refused("consistent-lists"):
        server.unmask("a", sites, [], {"a": signatures["a"], "b": signatures["b"]})
    unchecked = Server(round_=2)
    unchecked.share()
    unchecked.train()
    with _refused("consistent-lists"):  # no consistency check first
        unchecked.unmask("a", sites, [], signatures)


def test_a_peer_moved_between_survived_and_dropped_is_refused():
    server = Server(sites=("a", "b", "c", "d"))
    server.share()
    server.train()
    everyone = ["a", "b", "c", "d"]
    signatures = server.check(everyone, [])
    # a's self-mask shares for "survivor" c, then c's key shares for "dropped" c
    with _refused("consistent-lists"):
        server.unmask("a", ["a", "b", "d"], ["c"], signatures)
    server.unmask("b", everyone, [], signatures)  # the lists all signed are still answered


def test_both_shares_of_one_peer_are_never_revealed():
    server = Server()
    server.share()
    server.train()
    sites = sorted(SITES)
    with _refused("one-share-per-peer"):
        server.check(sites, ["c"], to=["a"])  # c both survived and dropped
    signatures = server.check(sites, [])
    answer = server.unmask("a", sites, [], signatures)
    assert set(answer["b"]) == set(sites) and answer["s"] == {}
    with pytest.raises(SecAggRefused):  # a second request, whatever it says, gets nothing
        server.unmask("a", ["a", "b"], ["c"], signatures)


# --- each rule alone: the attack that only this check stops (the mutation suite's) -----------


def test_a_second_key_list_or_train_task_in_one_round_is_refused():
    server = Server()
    server.share()
    keys = {"keys": server.adverts, "threshold": safe_threshold(len(SITES))}
    with _refused("participant-sets"):  # new peers mid-round would re-key the shares
        server.clients["a"].answer(SHARE, 1, keys)
    server.train()
    routed = {"sites": sorted(SITES), "shares": {"a": {u: server.shares[u]["a"] for u in SITES}}}
    with _refused("participant-sets"):  # a second masking set in the round
        server.clients["a"].take_shares(1, routed)


def test_survivors_and_dropped_must_be_exactly_the_sites_masked_with():
    server = Server(sites=("a", "b", "c", "d"))
    server.share()  # threshold 3 of 4
    server.train()
    with _refused("participant-sets"):  # d neither survived nor dropped
        server.check(["a", "b", "c"], [], to=["a"])
    with _refused("participant-sets"):  # a itself counted as dropped
        server.check(["b", "c", "d"], ["a"], to=["a"])
    server.check(["a", "b", "c"], ["d"], to=["a"])  # the control: a list of its masked sites


def test_a_round_is_unmasked_once_even_for_the_same_lists():
    server = Server()
    server.share()
    server.train()
    sites = sorted(SITES)
    signatures = server.check(sites, [])
    server.unmask("a", sites, [], signatures)
    with _refused("one-share-per-peer"):
        server.unmask("a", sites, [], signatures)


def test_the_unmask_request_must_hold_the_lists_this_site_signed():
    # seven sites (threshold 5): a signs "nobody dropped"; five others sign "g dropped", enough
    # signatures without a's; a must still not reveal g's key shares
    seven = tuple("abcdefg")
    server = Server(sites=seven)
    server.share()
    server.train()
    server.check(list(seven), [], to=["a"])
    moved = server.check(list("abcdef"), ["g"], to=list("bcdef"))
    with _refused("consistent-lists"):
        server.unmask("a", list("abcdef"), ["g"], moved)


def test_a_signature_of_a_dropped_site_does_not_count():
    server = Server(sites=("a", "b", "c", "d"))
    server.share()  # threshold 3 of 4
    server.train()
    survivors, dropped = ["a", "b", "c"], ["d"]
    signatures = server.check(survivors, dropped, to=["a", "b"])
    signatures["d"] = server.clients["d"].identity.sign(check_text(JOB, 1, survivors, dropped))
    with _refused("consistent-lists"):  # only two survivors signed: fewer than the threshold
        server.unmask("a", survivors, dropped, signatures)


def test_a_credential_of_a_certificate_that_is_not_the_sites_is_refused():
    authority = LocalAuthority("tests")
    authority.identity("b", JOB)  # b's site certificate
    key = authority._sites["b"][0]
    authority._sites["b"] = (key, authority._cert("b", "user", key.public_key()))
    as_user = authority.identity("b", JOB).credential
    with pytest.raises(CredentialError, match="belongs to user"):
        check(as_user, authority.ca_pem(), JOB, "b")
    authority._sites["b"] = (key, authority._cert("c", "site", key.public_key()))
    with pytest.raises(CredentialError, match="belongs to site 'c'"):
        check(authority.identity("b", JOB).credential, authority.ca_pem(), JOB, "b")


def test_a_credential_out_of_its_certificates_validity_or_not_signed_by_it_is_refused():
    import time

    credential = AUTHORITY.identity("b", JOB).credential
    check(credential, AUTHORITY.ca_pem(), JOB, "b")  # the control
    with pytest.raises(CredentialError, match="certificate is not valid now"):
        check(credential, AUTHORITY.ca_pem(), JOB, "b", now=time.time() + 3 * 86400)
    another = AUTHORITY.identity("b", JOB).credential  # b's too, certifying another key
    forged = {**credential, "signature": another["signature"]}
    with pytest.raises(CredentialError, match="not signed by b's key"):
        check(forged, AUTHORITY.ca_pem(), JOB, "b")


def test_a_second_credential_for_one_site_in_one_job_is_refused():
    from atoll.fl.privacy.secagg.identity import PeerNotAuthenticated

    mine = AUTHORITY.identity("a", JOB)
    first, second = AUTHORITY.identity("b", JOB), AUTHORITY.identity("b", JOB)
    mine.public_key("b", first.credential)
    mine.public_key("b", first.credential)  # the same one again is fine
    with pytest.raises(PeerNotAuthenticated, match="two different credentials for b"):
        mine.public_key("b", second.credential)


# --- the server's exactness checks -------------------------------------------------------------


class _NoChannel:
    job_id = JOB


def _stream(params: dict[str, np.ndarray]) -> ModelStream:
    return ModelStream(encode(Model(params=params)))


def _round() -> SecureRound:
    return SecureRound(_NoChannel(), 1, {"round": 1}, None, 2, threshold=2)  # type: ignore[arg-type]


def test_the_server_rejects_an_unmasked_reply_in_a_secure_round():
    secure = _round()
    with pytest.raises(ResultRejected, match="unmasked result"):
        secure.add_masked("a", _stream({"x": np.ones(4, np.float32)}))
    with pytest.raises(ResultRejected, match="unmasked result"):  # masked words, no weight
        secure.add_masked("a", _stream({"x": np.ones(4, np.uint64)}))
    assert secure._masked == []


def test_the_server_rejects_a_masked_reply_of_other_names_or_shapes():
    secure = _round()
    words = {"x": np.ones(4, np.uint64), masking.WEIGHT: np.ones(1, np.uint64)}
    secure.add_masked("a", _stream(words))
    with pytest.raises(ResultRejected, match="names or shapes"):
        secure.add_masked("b", _stream({"x": np.ones(5, np.uint64),
                                        masking.WEIGHT: np.ones(1, np.uint64)}))
    with pytest.raises(ResultRejected, match="names or shapes"):
        secure.add_masked("b", _stream({"y": np.ones(4, np.uint64),
                                        masking.WEIGHT: np.ones(1, np.uint64)}))
    assert secure._masked == ["a"]


def test_the_pairwise_masks_cancel_only_between_the_two_sites_that_agreed_them():
    # what mask_info binds: the job, the round and the pair (a reused mask would unmask)
    one, other = crypto.KeyPair.generate(), crypto.KeyPair.generate()
    ab = crypto.agree(one.private, other.public, mask_info(JOB, 1, "a", "b"))
    assert ab == crypto.agree(other.private, one.public, mask_info(JOB, 1, "b", "a"))
    assert ab != crypto.agree(one.private, other.public, mask_info(JOB, 2, "a", "b"))
