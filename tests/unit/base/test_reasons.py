"""Reasons and refusals stay within what every hop carries, and never show a parent's paths."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from atoll.base.reasons import MAX_DETAILS_BYTES, MAX_REASON_CHARS, clip, clip_details, public


def test_a_long_reason_is_clipped_saying_how_much_went():
    assert clip("short") == "short"
    clipped = clip("x" * (MAX_REASON_CHARS + 500))
    assert clipped == "x" * MAX_REASON_CHARS + "... (500 more characters)"


def test_details_stay_under_the_limit_once_percent_encoded():
    for text in ("a" * 10_000, "é" * 10_000, "\x1b" * 10_000, "%" * 10_000, "😀" * 10_000):
        details = clip_details(text)
        encoded = urllib.parse.quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
        assert len(encoded) <= MAX_DETAILS_BYTES, text[:1]
        assert details.endswith("more characters)")
    assert clip_details("fine as it is") == "fine as it is"


def test_paths_are_made_relative_to_the_job_and_the_workspace_hidden():
    workspace = Path("/srv/kits/site-a/workspace")
    job = workspace / "jobs" / "f00d"
    reason = (f"[Errno 2] No such file or directory: '{job}/app/train.py'; "
              f"see {job}/logs/worker.log; scratch {workspace}/tmp/x; folder {job}")
    assert public(reason, [job], workspace) == (
        "[Errno 2] No such file or directory: 'app/train.py'; see logs/worker.log; "
        "scratch <workspace>/tmp/x; folder .")
