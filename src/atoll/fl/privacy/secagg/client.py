"""A site's side of secure aggregation: fresh keys, shares, masks, and the unmasking answer.

One ``SecAggClient`` lives in a site worker for the whole job; its state is per round and
dropped once the round is unmasked. The server is not trusted (Bonawitz et al. 2017, the
active-adversary protocol): everything it hands over is checked here, and each refusal names
the rule it broke (``RULES``):

- every key list entry is signed by the certified key of the site it names (no Sybil peers);
- the threshold is at least the safe bound for the sites listed (``safe_threshold``) and the
  sites at least this site's ``secure_aggregation.min_participants`` (local/privacy.yaml);
- the sites masked with (U2) are keyed sites, include this one and are at least the threshold;
- before anything is revealed, the survivors (U3) and the dropped are echoed and signed by each
  survivor (``secagg.check``), and the unmask request must carry at least threshold valid
  signatures over exactly the lists this site signed: every honest site then agrees on who
  survived, so none reveals a peer's self-mask share while another reveals its key share;
- the unmask request is answered once, with self-mask shares for survivors only and key
  shares for dropped sites only, never both for one site.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.fl.privacy.secagg import crypto, shamir
from atoll.fl.privacy.secagg.identity import PeerNotAuthenticated, SiteIdentity, signed_text
from atoll.spec.errors import AtollError

ADVERTISE, SHARE, CHECK, UNMASK = ("secagg.advertise", "secagg.share", "secagg.check",
                                   "secagg.unmask")
TOPICS = (ADVERTISE, SHARE, CHECK, UNMASK)

# The rules a site holds the server to; a refusal starts with its name.
RULES = {
    "authenticated-peers": "every site's round keys are signed by its site-certified key",
    "safe-threshold": "threshold > 2/3 of the sites keyed (Bonawitz et al. 2017, active model)",
    "min-participants": "at least local/privacy.yaml secure_aggregation.min_participants sites",
    "participant-sets": "U3 within U2 within U1, this site in each, each at least the threshold",
    "consistent-lists": "threshold survivors signed the same survivors and dropped lists",
    "one-share-per-peer": "a self-mask share for a survivor or a key share for a dropped site, "
                          "once, never both",
}


class SecAggRefused(AtollError, RuntimeError):
    """This site will not take the step the server asked for; the message says why."""


def refused(rule: str, why: str) -> SecAggRefused:
    return SecAggRefused(f"secure aggregation rule {rule} ({RULES[rule]}): {why}")


def safe_threshold(sites: int) -> int:
    """The least threshold that keeps a site's secrets from a server that also controls fewer
    than a third of the sites (Bonawitz et al. 2017, active model: t > 2n/3), at least 2."""
    return max(2, 2 * sites // 3 + 1)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def unb64(text: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except ValueError:
        raise SecAggRefused(f"{what} is not base64") from None


def share_info(job_id: str, round_: int, a: str, b: str) -> str:
    low, high = sorted((a, b))
    return f"atoll-secagg-share|{job_id}|{round_}|{low}|{high}"


def mask_info(job_id: str, round_: int, a: str, b: str) -> str:
    low, high = sorted((a, b))
    return f"atoll-secagg-mask|{job_id}|{round_}|{low}|{high}"


def share_aad(job_id: str, round_: int, sender: str, recipient: str) -> str:
    return f"{job_id}|{round_}|{sender}->{recipient}"


def add_masks(encoded: dict[str, np.ndarray], seeds: list[tuple[bytes, int]]) -> None:
    """Add each (seed, sign) expanded over every entry (stream = index in sorted names), in
    place, modulo the words' width."""
    for stream, name in enumerate(sorted(encoded)):
        for seed, sign in seeds:
            crypto.add_mask(encoded[name], seed, stream, sign)


@dataclass
class _Round:
    cipher_keys: crypto.KeyPair
    mask_keys: crypto.KeyPair
    self_seed: bytes
    threshold: int = 0
    peers: dict[str, dict[str, bytes]] = field(default_factory=dict)  # U1: site -> {"c", "s"}
    credentials: dict[str, Any] = field(default_factory=dict)  # U1: site -> its credential
    held: dict[str, str] = field(default_factory=dict)  # sender -> its encrypted share for us
    masked_with: list[str] | None = None  # U2: the sites whose pairwise masks we added
    signed: tuple[list[str], list[str]] | None = None  # (U3, dropped) as this site signed them


def keys_text(job_id: str, round_: int, site: str, c: bytes, s: bytes) -> bytes:
    return signed_text("keys", job_id=job_id, round=round_, site=site, c=b64(c), s=b64(s))


def check_text(job_id: str, round_: int, survivors: list[str], dropped: list[str]) -> bytes:
    return signed_text("check", job_id=job_id, round=round_, survivors=sorted(survivors),
                       dropped=sorted(dropped))


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or \
            len(set(value)) != len(value):
        raise refused("participant-sets", f"{what} is not a list of distinct site names")
    return sorted(value)


class SecAggClient:
    def __init__(self, site: str, job_id: str, identity: SiteIdentity,
                 min_participants: int | None = None):
        self.site = site
        self.job_id = job_id
        self.identity = identity
        self.min_participants = min_participants  # local/privacy.yaml, None: no minimum
        self.rounds: dict[int, _Round] = {}
        self.unmasked: set[int] = set()  # rounds answered: never a second set of shares

    def answer(self, topic: str, round_: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The reply's meta for one protocol step of ``round_``."""
        if round_ in self.unmasked:  # one set of shares per round, for one masked update
            raise refused("one-share-per-peer", f"round {round_} was unmasked already: this "
                          "site answers once")
        if topic == ADVERTISE:
            state = _Round(crypto.KeyPair.generate(), crypto.KeyPair.generate(), crypto.new_seed())
            self.rounds = {round_: state}  # earlier rounds are over: forget their secrets
            c, s = state.cipher_keys.public, state.mask_keys.public
            return {"c": b64(c), "s": b64(s), "cred": self.identity.credential,
                    "sig": self.identity.sign(keys_text(self.job_id, round_, self.site, c, s))}
        state = self.rounds.get(round_)
        if state is None:
            raise SecAggRefused(f"{topic} for round {round_}, which this site has no keys for")
        if topic == SHARE:
            return self._share(round_, state, meta)
        if topic == CHECK:
            return self._check(round_, state, meta)
        if topic == UNMASK:
            return self._unmask(round_, state, meta)
        raise SecAggRefused(f"unknown secure aggregation step {topic!r}")

    def _enough(self, count: int, what: str, threshold: int) -> None:
        if count < threshold:
            raise refused("participant-sets", f"{what} has {count} site(s), fewer than the "
                          f"threshold {threshold}")
        if self.min_participants is not None and count < self.min_participants:
            raise refused("min-participants", f"{what} has {count} site(s); this site's "
                          f"local/privacy.yaml asks for at least {self.min_participants}")

    def _share(self, round_: int, state: _Round, meta: dict[str, Any]) -> dict[str, Any]:
        keys, threshold = meta.get("keys"), meta.get("threshold")
        if not isinstance(keys, dict) or not isinstance(threshold, int) or \
                isinstance(threshold, bool) or not all(isinstance(k, dict) for k in keys.values()):
            raise SecAggRefused("the share step needs keys and a threshold")
        if state.peers:
            raise refused("participant-sets", "the key list came twice in one round")
        peers, credentials = {}, {}
        for site, k in sorted(keys.items()):
            c, s = unb64(k.get("c"), f"{site}'s key"), unb64(k.get("s"), f"{site}'s key")
            try:
                self.identity.verify(site, k.get("cred"),
                                     keys_text(self.job_id, round_, site, c, s), k.get("sig"))
            except PeerNotAuthenticated as exc:
                raise refused("authenticated-peers", str(exc)) from None
            peers[site], credentials[site] = {"c": c, "s": s}, k.get("cred")
        if peers.get(self.site) != {"c": state.cipher_keys.public, "s": state.mask_keys.public}:
            raise SecAggRefused("the server's key list does not hold this site's own keys")
        least = safe_threshold(len(peers))
        if threshold < least or threshold > len(peers):
            raise refused("safe-threshold", f"threshold {threshold} for {len(peers)} sites; it "
                          f"must be between {least} and {len(peers)}")
        self._enough(len(peers), "the key list", threshold)
        state.peers, state.credentials, state.threshold = peers, credentials, threshold
        order = sorted(state.peers)
        xs = [order.index(s) + 1 for s in order]
        seed_shares = shamir.split(state.self_seed, xs, threshold)
        key_shares = shamir.split(state.mask_keys.private, xs, threshold)
        out: dict[str, str] = {}
        for site in order:
            x = order.index(site) + 1
            plain = json.dumps({"b": hex(seed_shares[x]), "s": hex(key_shares[x])}).encode()
            key = crypto.agree(state.cipher_keys.private, state.peers[site]["c"],
                               share_info(self.job_id, round_, self.site, site))
            out[site] = crypto.encrypt(key, plain, share_aad(self.job_id, round_, self.site, site))
        return {"shares": out}

    def take_shares(self, round_: int, routed: dict[str, Any]) -> None:
        """The shares addressed to this site, carried by the train task; the sites listed are
        those that will be masked with."""
        state = self.rounds.get(round_)
        sites, shares = routed.get("sites"), routed.get("shares")
        if state is None or not state.peers or not isinstance(shares, dict):
            raise SecAggRefused(f"the train task of round {round_} has no usable secure "
                                "aggregation data (did the setup steps run?)")
        if state.masked_with is not None:
            raise refused("participant-sets", "a second train task in one round")
        sites = _names(sites, "the sites to mask with")
        if self.site not in sites or any(s not in state.peers for s in sites):
            raise refused("participant-sets", "the train task names sites that did not share "
                          "keys, or not this site")
        self._enough(len(sites), "the sites to mask with", state.threshold)
        mine = shares.get(self.site, {})
        if not isinstance(mine, dict):
            raise SecAggRefused("the shares for this site are not a mapping")
        state.held = {sender: str(token) for sender, token in mine.items() if sender in sites}
        missing = [s for s in sites if s not in state.held]
        if missing:
            raise SecAggRefused(f"no share from {missing} reached this site")
        state.masked_with = sites

    def mask(self, round_: int, encoded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``encoded`` (masking.encode) with this site's self mask and pairwise masks, in place."""
        state = self.rounds.get(round_)
        if state is None or state.masked_with is None:
            raise SecAggRefused(f"round {round_}: no masking set up for this reply")
        seeds = [(state.self_seed, 1)]
        for peer in state.masked_with:
            if peer != self.site:
                seed = crypto.agree(state.mask_keys.private, state.peers[peer]["s"],
                                    mask_info(self.job_id, round_, self.site, peer))
                seeds.append((seed, 1 if self.site < peer else -1))
        add_masks(encoded, seeds)
        return encoded

    def _lists(self, state: _Round, meta: dict[str, Any]) -> tuple[list[str], list[str]]:
        survivors = _names(meta.get("survivors"), "survivors")
        dropped = _names(meta.get("dropped"), "dropped")
        if state.masked_with is None:
            raise refused("participant-sets", "this site masked nothing this round")
        if set(survivors) & set(dropped):
            raise refused("one-share-per-peer", f"{sorted(set(survivors) & set(dropped))} "
                          "named both survived and dropped")
        if set(survivors) | set(dropped) != set(state.masked_with):
            raise refused("participant-sets", "survivors and dropped are not the sites this "
                          "site masked with")
        if self.site not in survivors:
            raise refused("participant-sets", "the request counts this site as dropped")
        self._enough(len(survivors), "the survivors", state.threshold)
        return survivors, dropped

    def _check(self, round_: int, state: _Round, meta: dict[str, Any]) -> dict[str, Any]:
        """The consistency check: sign the survivors and dropped lists, once per round."""
        survivors, dropped = self._lists(state, meta)
        if state.signed is not None:
            raise refused("consistent-lists", "the consistency check came twice in one round")
        state.signed = (survivors, dropped)
        return {"sig": self.identity.sign(check_text(self.job_id, round_, survivors, dropped))}

    def _unmask(self, round_: int, state: _Round, meta: dict[str, Any]) -> dict[str, Any]:
        if state.signed is None:
            raise refused("consistent-lists", "no consistency check came before the unmask "
                          "request")
        survivors = _names(meta.get("survivors"), "survivors")
        dropped = _names(meta.get("dropped"), "dropped")
        if (survivors, dropped) != state.signed:
            moved = sorted(set(state.signed[0]) ^ set(survivors))
            raise refused("consistent-lists", f"the unmask request moves {moved} between "
                          "survived and dropped from what this site signed")
        survivors, dropped = self._lists(state, meta)  # checked when signed; cheap again
        signatures = meta.get("signatures")
        if not isinstance(signatures, dict):
            raise refused("consistent-lists", "the unmask request carries no signatures")
        text = check_text(self.job_id, round_, survivors, dropped)
        valid = []
        for site, signature in sorted(signatures.items()):
            if site not in survivors:
                raise refused("consistent-lists", f"a signature from {site!r}, not a survivor")
            try:
                self.identity.verify(site, state.credentials[site], text, signature)
            except PeerNotAuthenticated as exc:
                raise refused("consistent-lists", f"{exc}: the sites were not all shown the "
                              "same survivors and dropped") from None
            valid.append(site)
        if len(valid) < state.threshold:
            raise refused("consistent-lists", f"{len(valid)} survivor(s) signed the lists, the "
                          f"threshold is {state.threshold}")
        self.unmasked.add(round_)
        reveal: dict[str, dict[str, str]] = {"b": {}, "s": {}}
        for sender in state.masked_with:
            key = crypto.agree(state.cipher_keys.private, state.peers[sender]["c"],
                               share_info(self.job_id, round_, sender, self.site))
            share = json.loads(crypto.decrypt(key, state.held[sender],
                                              share_aad(self.job_id, round_, sender, self.site)))
            kind = "b" if sender in survivors else "s"
            reveal[kind][sender] = share[kind]
        self.rounds.pop(round_, None)  # done: nothing of this round is needed again
        return reveal
