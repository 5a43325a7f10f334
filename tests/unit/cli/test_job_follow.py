"""`atoll job logs --follow` prints what a log's tail adds since the last answer, also once the
tail (the server sends the last 256 KiB) has moved past the start of what was shown."""

from __future__ import annotations

from atoll.cli.job import _added


def test_a_growing_log_prints_only_its_new_end():
    assert _added("", "a\nb\n") == "a\nb\n"
    assert _added("a\nb\n", "a\nb\nc\n") == "c\n"
    assert _added("a\nb\n", "a\nb\n") == ""


def test_a_tail_that_moved_on_is_matched_by_the_end_of_what_was_shown():
    shown = "".join(f"line {i}\n" for i in range(100))
    tail = "".join(f"line {i}\n" for i in range(20, 120))  # the window moved by 20 lines
    assert _added(shown, tail) == "".join(f"line {i}\n" for i in range(100, 120))


def test_a_log_with_nothing_in_common_is_printed_whole():
    assert _added("old\n", "new\n") == "new\n"
