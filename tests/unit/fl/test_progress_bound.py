"""A round's progress event at 10,000 sites still fits in one worker report (fl/progress_bound.py):
the first sites' entries are kept, the rest counted; a small event passes untouched."""

from __future__ import annotations

import json

from atoll.fl.progress_bound import MAX_REPORT_BYTES, bounded
from atoll.wire.bodies import MAX_WORKER_BODY, WorkerNote


def _round(n: int, failed: int = 0) -> dict:
    return {
        "event": "round", "round": 2, "total_rounds": 3,
        "sites": {f"sim-{i:05d}": {"echoed": True} for i in range(n)},
        "failed": {f"gone-{i:05d}": "site parent disconnected" for i in range(failed)},
    }


def test_a_small_event_is_sent_as_it_is():
    event = _round(10)
    assert bounded(event) is event


def test_ten_thousand_sites_fit_in_one_report_and_the_rest_are_counted():
    event = _round(10_000)
    assert len(json.dumps(event)) > MAX_WORKER_BODY  # the report the parent refused
    out = bounded(event)
    text = json.dumps(out)
    assert len(text) <= MAX_REPORT_BYTES < MAX_WORKER_BODY
    WorkerNote.parse(text)  # the parent takes it
    kept = list(out["sites"])
    assert kept == list(event["sites"])[: len(kept)] and len(kept) > 100
    assert out["sites_omitted"] == 10_000 - len(kept)
    assert (out["event"], out["round"], out["total_rounds"]) == ("round", 2, 3)
    assert event["sites"]["sim-09999"] == {"echoed": True}  # the workflow's own copy is whole


def test_failed_sites_are_cut_too_once_the_sites_are_gone():
    out = bounded(_round(5_000, failed=5_000))
    assert len(json.dumps(out)) <= MAX_REPORT_BYTES
    assert out["sites"] == {} and out["sites_omitted"] == 5_000
    assert 0 < len(out["failed"]) < 5_000 and out["failed_omitted"] == 5_000 - len(out["failed"])


def test_an_event_too_large_for_other_reasons_keeps_its_plain_fields():
    out = bounded({"event": "note", "round": 1, "blob": ["x" * 1000] * 100})
    assert out == {"event": "note", "round": 1}
