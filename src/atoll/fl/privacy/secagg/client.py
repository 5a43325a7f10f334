"""A site's side of secure aggregation: fresh keys, shares, masks, and the unmasking answer.

One ``SecAggClient`` lives in a site worker for the whole job; its state is per round and
dropped once the round is unmasked. The site refuses what would let the server unmask it
alone: answering the unmask request twice, or revealing both the self-mask share and the
mask-key share of one site.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.fl.privacy.secagg import crypto, shamir
from atoll.spec.errors import AtollError

ADVERTISE, SHARE, UNMASK = "secagg.advertise", "secagg.share", "secagg.unmask"
TOPICS = (ADVERTISE, SHARE, UNMASK)


class SecAggRefused(AtollError, RuntimeError):
    """This site will not take the step the server asked for; the message says why."""


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
    place, modulo 2**64."""
    for stream, name in enumerate(sorted(encoded)):
        for seed, sign in seeds:
            crypto.add_mask(encoded[name], seed, stream, sign)


@dataclass
class _Round:
    cipher_keys: crypto.KeyPair
    mask_keys: crypto.KeyPair
    self_seed: bytes
    peers: dict[str, dict[str, bytes]] = field(default_factory=dict)  # site -> {"c", "s"}
    held: dict[str, str] = field(default_factory=dict)  # sender -> its encrypted share for us
    masked_with: list[str] | None = None  # the sites whose pairwise masks we added
    unmasked: bool = False


class SecAggClient:
    def __init__(self, site: str, job_id: str):
        self.site = site
        self.job_id = job_id
        self.rounds: dict[int, _Round] = {}

    def answer(self, topic: str, round_: int, meta: dict[str, Any]) -> dict[str, Any]:
        """The reply's meta for one protocol step of ``round_``."""
        if topic == ADVERTISE:
            state = _Round(crypto.KeyPair.generate(), crypto.KeyPair.generate(), crypto.new_seed())
            self.rounds = {round_: state}  # earlier rounds are over: forget their secrets
            return {"c": b64(state.cipher_keys.public), "s": b64(state.mask_keys.public)}
        state = self.rounds.get(round_)
        if state is None:
            raise SecAggRefused(f"{topic} for round {round_}, which this site has no keys for")
        if topic == SHARE:
            return self._share(round_, state, meta)
        if topic == UNMASK:
            return self._unmask(round_, state, meta)
        raise SecAggRefused(f"unknown secure aggregation step {topic!r}")

    def _share(self, round_: int, state: _Round, meta: dict[str, Any]) -> dict[str, Any]:
        keys, threshold = meta.get("keys"), meta.get("threshold")
        if not isinstance(keys, dict) or not isinstance(threshold, int):
            raise SecAggRefused("the share step needs keys and a threshold")
        state.peers = {site: {"c": unb64(k.get("c"), f"{site}'s key"),
                              "s": unb64(k.get("s"), f"{site}'s key")} for site, k in keys.items()}
        mine = state.peers.get(self.site)
        if mine != {"c": state.cipher_keys.public, "s": state.mask_keys.public}:
            raise SecAggRefused("the server's key list does not hold this site's own keys")
        if threshold < 2 or threshold > len(state.peers):
            raise SecAggRefused(f"threshold {threshold} for {len(state.peers)} sites")
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
        if state is None or not isinstance(sites, list) or not isinstance(shares, dict):
            raise SecAggRefused(f"the train task of round {round_} has no usable secure "
                                "aggregation data (did the setup steps run?)")
        if self.site not in sites or any(s not in state.peers for s in sites):
            raise SecAggRefused("the train task names sites that did not share keys")
        state.held = {sender: str(token) for sender, token in shares.get(self.site, {}).items()}
        missing = [s for s in sites if s not in state.held]
        if missing:
            raise SecAggRefused(f"no share from {missing} reached this site")
        state.masked_with = sorted(sites)

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

    def _unmask(self, round_: int, state: _Round, meta: dict[str, Any]) -> dict[str, Any]:
        survivors, dropped = meta.get("survivors"), meta.get("dropped")
        if not isinstance(survivors, list) or not isinstance(dropped, list):
            raise SecAggRefused("the unmask step needs survivors and dropped")
        if state.unmasked:
            raise SecAggRefused(f"round {round_} was unmasked already: this site answers once")
        if state.masked_with is None or set(survivors) & set(dropped) or \
                set(survivors) | set(dropped) != set(state.masked_with):
            raise SecAggRefused("the unmask request does not split this round's sites into "
                                "survivors and dropped: refusing to reveal shares")
        if self.site not in survivors:
            raise SecAggRefused("the unmask request counts this site as dropped")
        state.unmasked = True
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
