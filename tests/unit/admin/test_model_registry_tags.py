"""The model version's tags from a verified record (admin/model_registry.py `record_tags`): a
round stated twice (re-run after a server restart, its model different) counts once, with its
later digest, and the last round is the highest, wherever its entry stands."""

from __future__ import annotations

from atoll.admin.model_registry import record_tags
from atoll.pki.provenance import Entry, Verified


def _entry(seq: int, kind: str, body: dict) -> Entry:
    return Entry(seq, kind, "server", "server", 0, body, f"sha256:{seq}")


def test_rounds_count_once_each_with_their_latest_digest():
    entries = [_entry(0, "job.signed", {"content_digest": "c"}),
               _entry(1, "round.model", {"round": 1, "digest": "d1"}),
               _entry(2, "round.model", {"round": 3, "digest": "d3"}),
               _entry(3, "round.model", {"round": 2, "digest": "d2"}),
               _entry(4, "round.model", {"round": 3, "digest": "d3-again"}),
               _entry(5, "job.final", {"model_digest": "m", "state": "COMPLETED"})]
    tags = record_tags(b"{}", Verified("j", entries, "m"))
    assert tags["atoll.rounds"] == "3"
    assert tags["atoll.last_round_digest"] == "d3-again"
    assert tags["atoll.record_entries"] == "6" and tags["atoll.model_digest"] == "m"
