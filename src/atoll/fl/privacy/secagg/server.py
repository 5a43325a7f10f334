"""The server's side of secure aggregation for one round: set up, fold masked updates, unmask.

The server never holds one site's unmasked update: ``add_masked`` folds each reply into a
running sum modulo 2**32 or 2**64 (each variable's word width) as it streams in (each reply is masked by a uniform self-mask, so it
is noise on its own), and ``unmask`` removes the masks from the sum alone. A test instruments
exactly these two entry points and the channel's replies (tests/unit/fl/privacy/).

Drop-outs (Bonawitz et al. 2017): a site that shared its keys but sent no masked update leaves
its pairwise masks in the others' updates; the server rebuilds its mask key from t shares and
removes them. A site that sent its masked update and then left is still in the sum; its
self-mask seed is rebuilt from the other sites' shares. Either way at least ``threshold`` sites
must answer the consistency check and the unmask step.

The sites trust nothing said here (client.py checks each step): the keys are forwarded with
their sites' signatures, and before unmasking every survivor signs the survivors and dropped
lists (``secagg.check``); the unmask request carries those signatures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atoll.fl.aggregation import AggregateCorrupted, ResultRejected
from atoll.fl.channels import ServerChannel
from atoll.fl.model import Model
from atoll.fl.privacy.secagg import crypto, masking, shamir
from atoll.fl.privacy.secagg.client import (
    ADVERTISE,
    CHECK,
    RULES,
    SHARE,
    UNMASK,
    SecAggRefused,
    add_masks,
    mask_info,
    safe_threshold,
    unb64,
)
from atoll.fl.serde import ModelStream, SerdeError, encode
from atoll.fl.workflows.rounds import WorkflowError, describe, gather

log = logging.getLogger(__name__)


_WORDS = (np.dtype(np.uint32), np.dtype(np.uint64))  # the masked words' widths
_ANSWER_KEYS = {ADVERTISE: {"c", "s", "cred", "sig"}, SHARE: {"shares"}, CHECK: {"sig"},
                UNMASK: {"b", "s"}}


def default_threshold(sites: int) -> int:
    """The least threshold every site accepts for ``sites`` keyed sites (client.safe_threshold:
    more than two thirds, at least 2)."""
    return safe_threshold(sites)


@dataclass
class SecureRound:
    channel: ServerChannel
    round_: int
    headers: dict[str, Any]
    timeout: float | None
    min_clients: int
    threshold: int | None = None  # app.yaml privacy.secure_aggregation.threshold
    ring: masking.Ring = field(default_factory=masking.Ring)  # its max_sum and word_bits
    keys: dict[str, dict[str, bytes]] = field(default_factory=dict)  # U1: site -> {"c", "s"}
    adverts: dict[str, dict[str, Any]] = field(default_factory=dict)  # U1, signed, as sent
    sites: list[str] = field(default_factory=list)  # U2: shared their secrets
    routed: dict[str, dict[str, str]] = field(default_factory=dict)  # recipient -> sender -> share
    failed: dict[str, str] = field(default_factory=dict)
    spare: dict[str, np.ndarray] = field(default_factory=dict)  # word buffers to sum into
    _sum: dict[str, np.ndarray] = field(default_factory=dict)
    _masked: list[str] = field(default_factory=list)  # U3: sent a masked update

    # --- setup: keys and shares -----------------------------------------------------------------

    def _step(self, targets: list[str], topic: str, meta: dict[str, Any], need: int) -> dict:
        """Send one protocol step to ``targets``; {site: its reply's meta} of those answering."""
        task = self.channel.send(targets, topic, self.headers, encode(Model(meta=meta)))
        answers: dict[str, dict[str, Any]] = {}

        def take(site: str, stream: ModelStream) -> None:
            meta = stream.read().meta
            expected = _ANSWER_KEYS[topic]
            if not expected <= set(meta):
                raise ResultRejected(
                    f"answered {topic} without {sorted(expected - set(meta))}: the site's "
                    "app.yaml must turn on privacy.secure_aggregation too")
            answers[site] = meta

        outcome = gather(self.channel, task, targets, self.timeout, take, need)
        self.failed.update(outcome.failed)
        if len(answers) < need:
            raise WorkflowError(
                f"round {self.round_} secure aggregation ({topic}): {len(answers)} site(s) "
                f"answered, {need} needed (threshold and min_clients). Failed: "
                f"{describe(outcome.failed) or 'none'}")
        return answers

    def setup(self, targets: list[str]) -> list[str]:
        """Steps 1 and 2; returns the sites that will mask (U2)."""
        need = max(self.min_clients, 2)
        advertised = self._step(list(targets), ADVERTISE, {}, need)
        try:
            self.keys = {site: {"c": unb64(m["c"], f"{site}'s key"),
                                "s": unb64(m["s"], f"{site}'s key")}
                         for site, m in sorted(advertised.items())}
        except SecAggRefused as exc:
            raise WorkflowError(f"round {self.round_} secure aggregation: {exc}") from None
        if self.threshold is None:
            self.threshold = default_threshold(len(self.keys))
        if self.threshold > len(self.keys):
            raise WorkflowError(
                f"round {self.round_}: privacy.secure_aggregation.threshold is {self.threshold} "
                f"but only {len(self.keys)} site(s) took part; lower it or add sites")
        if self.threshold < safe_threshold(len(self.keys)):
            raise WorkflowError(
                f"round {self.round_}: privacy.secure_aggregation.threshold is {self.threshold} "
                f"for {len(self.keys)} sites, below the safe bound "
                f"{safe_threshold(len(self.keys))} (rule safe-threshold: "
                f"{RULES['safe-threshold']}); every site would refuse it: raise it or leave it "
                "out")
        need = max(need, self.threshold)
        self.adverts = {site: {k: advertised[site][k] for k in ("c", "s", "cred", "sig")}
                        for site in self.keys}
        shared = self._step(sorted(self.keys), SHARE,
                            {"keys": self.adverts, "threshold": self.threshold}, need)
        self.sites = sorted(shared)
        self.routed = {v: {u: str(shared[u]["shares"][v]) for u in self.sites} for v in self.sites}
        return self.sites

    def train_meta(self) -> dict[str, Any]:
        """What the train task carries: the encrypted shares (each for one site's key only)."""
        return {"sites": self.sites, "shares": self.routed}

    # --- masked updates ---------------------------------------------------------------------------

    def add_masked(self, site: str, stream: ModelStream) -> Model:
        """Fold one masked reply into the sum as it arrives; returns its header."""
        entries = {name: (np.dtype(dtype), shape) for name, dtype, shape in stream.entries}
        if any(dtype not in _WORDS for dtype, _ in entries.values()) or \
                entries.get(masking.WEIGHT) != (np.dtype(np.uint64), (1,)):
            raise ResultRejected("sent an unmasked result to a secure aggregation round "
                                 "(privacy.secure_aggregation is on in the server's app.yaml: "
                                 "the site's app.yaml needs it too)")
        if not self._sum:
            self._sum = {n: _zeroed(self.spare.pop(n, None), shape, dtype)
                         for n, (dtype, shape) in entries.items()}
        elif entries != {n: (a.dtype, a.shape) for n, a in self._sum.items()}:
            raise ResultRejected("masked result's names or shapes differ from the other "
                                 "sites' (or their word widths: every site's app.yaml needs the same "
                                 "privacy.secure_aggregation)")
        try:
            for name, start, block in stream.blocks():
                target = self._sum[name].reshape(-1)[start:start + len(block)]
                np.add(target, block, out=target)  # modulo 2**32 or 2**64
        except SerdeError as exc:
            raise AggregateCorrupted(f"a masked result broke off ({exc}); the round's sum is "
                                     "lost") from None
        self._masked.append(site)
        return stream.model

    # --- unmasking ----------------------------------------------------------------------------------

    def unmask(self, mean: bool = False) -> tuple[dict[str, np.ndarray], float]:
        """Step 4: the weighted sum of the survivors' updates (``mean``: their weighted mean)
        and their total weight."""
        survivors = sorted(self._masked)
        dropped = sorted(set(self.sites) - set(survivors))
        assert self.threshold is not None
        need = self.threshold
        lists = {"survivors": survivors, "dropped": dropped}
        checked = self._step(survivors, CHECK, lists, need)  # each survivor signs the lists
        signatures = {site: a["sig"] for site, a in sorted(checked.items())}
        answers = self._step(sorted(checked), UNMASK, {**lists, "signatures": signatures}, need)
        order = sorted(self.keys)  # share points: position in the key list, from 1
        point = {site: order.index(site) + 1 for site in order}

        def rebuild(kind: str, owner: str) -> bytes:
            shares = [(point[holder], int(str(a[kind][owner]), 16))
                      for holder, a in answers.items() if owner in a.get(kind, {})]
            if len(shares) < self.threshold:
                raise WorkflowError(f"round {self.round_}: only {len(shares)} share(s) of "
                                    f"{owner}'s secret came back, {self.threshold} needed")
            return shamir.combine(shares)

        seeds: list[tuple[bytes, int]] = [(rebuild("b", site), -1) for site in survivors]
        for gone in dropped:
            private = rebuild("s", gone)
            if crypto.public_of(private) != self.keys[gone]["s"]:
                raise WorkflowError(f"round {self.round_}: the shares of {gone}'s mask key "
                                    "do not rebuild it; a site answered wrongly")
            for site in survivors:  # what `site` added for `gone`, taken away again
                seed = crypto.agree(private, self.keys[site]["s"],
                                    mask_info(self.channel.job_id, self.round_, site, gone))
                seeds.append((seed, -1 if site < gone else 1))
        add_masks(self._sum, seeds)
        total, self._sum = self._sum, {}
        if dropped:
            log.info("round %d: secure aggregation recovered from %d site(s) that sent no masked "
                     "update: %s", self.round_, len(dropped), ", ".join(dropped))
        return masking.decode(total, self.ring, mean)


def _zeroed(spare: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero array of ``shape`` and ``dtype``: ``spare``'s memory when it fits (no fresh
    pages)."""
    if spare is None or spare.size != int(np.prod(shape)) or spare.dtype != dtype or \
            not spare.flags.c_contiguous:
        return np.zeros(shape, dtype)
    spare = spare.reshape(shape)
    spare.fill(0)
    return spare
