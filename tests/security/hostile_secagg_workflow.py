"""A job's own server-side workflow that attacks secure aggregation (tests/security/
test_hostile_server_secagg.py ships it in the job as hostile.py).

It speaks the protocol to each site on its own (one task per site, so it can tell each site
something different), keeps every site's masked update apart, collects whatever shares the
sites reveal, and then tries to unmask the victim's update alone. It writes what it got to
``attack.json``: the victim's recovered update when it succeeded, and every site's refusal.
"""

from __future__ import annotations

import base64
import json

import numpy as np

from atoll.fl.model import Model
from atoll.fl.privacy.secagg import crypto, masking, shamir
from atoll.fl.privacy.secagg.client import (
    ADVERTISE,
    CHECK,
    SHARE,
    UNMASK,
    SecAggClient,
    add_masks,
    mask_info,
    share_aad,
    share_info,
)
from atoll.fl.privacy.secagg.identity import LocalAuthority
from atoll.fl.privacy.site_privacy import SECAGG_META
from atoll.fl.serde import decode, encode
from atoll.workflow import Workflow

ROUND = 1
WAIT_S = 120.0


class Hostile(Workflow):
    def run(self) -> None:
        ctx = self.ctx
        self.sites = sorted(ctx.sites)
        self.victim = self.sites[0]
        self.failed: dict[str, str] = {}
        self.reveals: dict[str, dict] = {}
        self.masked: dict[str, dict[str, np.ndarray]] = {}
        self.fakes: dict[str, dict] = {}
        attack = self.args["attack"]
        getattr(self, attack)()
        recovered = self.unmask_victim()
        ctx.save_json("attack", {
            "attack": attack, "failed": self.failed,
            "recovered": {k: v.tolist() for k, v in recovered.items()} if recovered else None,
            "revealed": {h: {k: sorted(v) for k, v in r.items()} for h, r in self.reveals.items()},
        })

    # --- talking to each site alone -------------------------------------------------------------

    def ask(self, per_site: dict[str, tuple[str, dict]], params=None) -> dict[str, Model]:
        channel = self.ctx.channel
        tasks = {}
        for site, (topic, meta) in per_site.items():
            if site in self.failed:
                continue
            model = Model(params=params or {}, meta=meta, round=ROUND)
            tasks[site] = channel.send([site], topic, {"round": ROUND}, encode(model))
        answers = {}
        for site, task in tasks.items():
            for reply in channel.replies(task, timeout=WAIT_S):
                if reply.error is not None:
                    self.failed[site] = reply.error
                else:
                    answers[site] = decode(reply.chunks)
                break
            else:
                self.failed.setdefault(site, "no answer")
        return answers

    def everyone(self, topic: str, meta: dict, sites=None) -> dict[str, dict]:
        answers = self.ask({s: (topic, meta) for s in (sites or self.sites)})
        return {s: m.meta for s, m in answers.items()}

    def advertise(self) -> None:
        self.adverts = self.everyone(ADVERTISE, {})

    def share(self, threshold: int, adverts=None, sites=None) -> None:
        self.threshold = threshold
        self.adverts_used = adverts or self.adverts
        answers = self.everyone(SHARE, {"keys": self.adverts_used, "threshold": threshold},
                                sites)
        self.shares = {s: a["shares"] for s, a in answers.items()}

    def train(self, lists: dict[str, list[str]] | None = None, only=None) -> None:
        initial = self.ctx.initial_model.params
        self.u2: dict[str, list[str]] = {}
        for site in only or self.sites:
            if site in self.failed or site not in self.shares:
                continue
            sites = (lists or {}).get(site, sorted(self.shares))
            self.u2[site] = sites
            routed = {"sites": sites, "shares": {site: {
                u: self.shares[u].get(site, "") for u in sites if u in self.shares}}}
            answers = self.ask({site: ("train", {SECAGG_META: routed})}, params=initial)
            if site in answers:
                self.masked[site] = answers[site].params

    def check(self, lists: dict[str, tuple[list[str], list[str]]]) -> dict[str, str]:
        answers = self.ask({s: (CHECK, {"survivors": sv, "dropped": dr})
                            for s, (sv, dr) in lists.items()})
        return {s: m.meta["sig"] for s, m in answers.items()}

    def unmask(self, lists: dict[str, tuple[list[str], list[str]]], signatures) -> None:
        answers = self.ask({s: (UNMASK, {"survivors": sv, "dropped": dr,
                                         "signatures": signatures})
                            for s, (sv, dr) in lists.items()})
        for site, model in answers.items():
            mine = self.reveals.setdefault(site, {"b": {}, "s": {}})
            for kind in ("b", "s"):
                mine[kind].update(model.meta.get(kind, {}))

    def honest_lists(self) -> dict[str, tuple[list[str], list[str]]]:
        return {s: (list(self.sites), []) for s in self.sites}

    # --- the attacks ---------------------------------------------------------------------------

    def honest(self) -> None:  # the control: the same calls, honestly
        self.advertise()
        self.share(3)
        self.train()
        sigs = self.check(self.honest_lists())
        self.unmask(self.honest_lists(), sigs)

    def self_only(self) -> None:
        """The reported attack: the victim masks with nobody but itself; the others reveal
        their shares of its self-mask seed."""
        self.advertise()
        self.share(3)
        self.train({self.victim: [self.victim]})
        others = [s for s in self.sites if s != self.victim]
        lists = {s: (list(self.sites), []) for s in others}
        self.unmask(lists, self.check(lists))

    def different_lists(self) -> None:
        """Each site is told another survivor set, so that each reveals a different kind of
        share for the victim's peers."""
        self.advertise()
        self.share(3)
        self.train()
        v = self.victim
        lists = {s: ([v] if s == v else [v, s], [p for p in self.sites if p not in (v, s)])
                 for s in self.sites}
        self.unmask(lists, self.check(lists))

    def both_shares(self) -> None:
        """An honest unmask, then a second request for the victim's mask-key shares."""
        self.honest()
        others = [s for s in self.sites if s != self.victim]
        lists = {s: (others, [self.victim]) for s in others}
        self.unmask(lists, {})

    def moved_peer(self) -> None:
        """Everyone signs the honest lists; three sites reveal the victim's self-mask shares
        for them; then the victim is moved to dropped for the others, so that they would
        reveal its mask-key shares too."""
        self.advertise()
        self.share(3)
        self.train()
        sigs = self.check(self.honest_lists())
        self.unmask({s: (list(self.sites), []) for s in self.sites[:3]}, sigs)
        others = [s for s in self.sites if s != self.victim]
        self.unmask({s: (others, [self.victim]) for s in others}, sigs)

    def low_threshold(self) -> None:
        """Threshold 2 of 4 (a majority is not enough): two halves each reach the threshold
        and each signs its own, consistent, view; one half reveals the victim's self-mask
        shares, the other its mask-key shares."""
        self.advertise()
        self.share(2)
        self.train()
        half = self.sites[:2]
        rest = self.sites[2:]
        lists = {s: (half, rest) if s in half else (rest, half) for s in self.sites}
        sigs = self.check(lists)
        for group in (half, rest):  # each half sees its own half's signatures only
            self.unmask({s: lists[s] for s in group},
                        {s: sig for s, sig in sigs.items() if s in group})

    def impersonate(self) -> None:
        """The server plays every other site with keys of its own (Sybil peers), signed by a
        CA of its own making; the victim's shares and pairwise masks are then all its own."""
        self.advertise()
        authority = LocalAuthority("proj")
        adverts = {self.victim: self.adverts[self.victim]}
        for site in self.sites[1:]:
            fake = SecAggClient(site, self.ctx.channel.job_id,
                                authority.identity(site, self.ctx.channel.job_id))
            adverts[site] = fake.answer(ADVERTISE, ROUND, {})
            self.fakes[site] = fake.rounds[ROUND]
        self.share(3, adverts, sites=[self.victim])
        if self.victim not in self.shares:
            return
        for site, state in self.fakes.items():  # as the fake site, decrypt the victim's share
            key = crypto.agree(state.cipher_keys.private, _raw(adverts[self.victim]["c"]),
                               share_info(self.ctx.channel.job_id, ROUND, self.victim, site))
            share = json.loads(crypto.decrypt(key, self.shares[self.victim][site], share_aad(
                self.ctx.channel.job_id, ROUND, self.victim, site)))
            self.reveals.setdefault(site, {"b": {}, "s": {}})["b"][self.victim] = share["b"]
        self.shares.update({s: {self.victim: "x"} for s in self.fakes})
        self.train(only=[self.victim])

    # --- unmasking the victim alone ------------------------------------------------------------

    def secret(self, kind: str, owner: str) -> bytes | None:
        order = sorted(self.adverts_used) if hasattr(self, "adverts_used") else self.sites
        points = [(order.index(h) + 1, int(r[kind][owner], 16))
                  for h, r in self.reveals.items() if owner in r[kind] and h in order]
        if len(points) < getattr(self, "threshold", 99):
            return None
        try:
            return shamir.combine(points)
        except ValueError:
            return None

    def unmask_victim(self) -> dict[str, np.ndarray] | None:
        v = self.victim
        if v not in self.masked:
            return None
        self_seed = self.secret("b", v)
        if self_seed is None:
            return None
        words = {k: a.copy() for k, a in self.masked[v].items()}
        seeds = [(self_seed, -1)]
        victim_key = self.secret("s", v)
        victim_public = _raw(self.adverts_used[v]["s"])
        for peer in self.u2[v]:
            if peer == v:
                continue
            sign = -1 if v < peer else 1
            info = mask_info(self.ctx.channel.job_id, ROUND, v, peer)
            if peer in self.fakes:
                seed = crypto.agree(self.fakes[peer].mask_keys.private, victim_public, info)
            elif victim_key is not None:
                seed = crypto.agree(victim_key, _raw(self.adverts_used[peer]["s"]), info)
            elif (peer_key := self.secret("s", peer)) is not None:
                seed = crypto.agree(peer_key, victim_public, info)
            else:
                return None
            seeds.append((seed, sign))
        add_masks(words, seeds)
        total, weight = masking.decode(words)
        return {k: a / weight for k, a in total.items()}


def _raw(text: str) -> bytes:
    return base64.b64decode(text)
