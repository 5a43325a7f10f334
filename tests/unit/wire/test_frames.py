"""Frames: header-then-data messages, one per stream or several in a row."""

from __future__ import annotations

import pytest

from atoll.wire import frames


def _message(head, *chunks):
    return list(frames.payload_frames(head, chunks))


def test_several_messages_in_one_stream_come_apart_in_order():
    stream = _message({"site": "a"}, b"aa", b"AA") + _message({"site": "b"}) + _message(
        {"site": "c"}, b"c")
    got = [(head["site"], b"".join(bytes(c) for c in payload))
           for head, payload in frames.split_many(iter(stream))]
    assert got == [("a", b"aaAA"), ("b", b""), ("c", b"c")]


def test_what_a_reader_leaves_of_one_message_is_skipped_not_taken_for_the_next():
    stream = _message({"n": 1}, b"x" * 10, b"y" * 10) + _message({"n": 2}, b"z")
    messages = frames.split_many(iter(stream))
    head, payload = next(messages)
    assert bytes(next(iter(payload))) == b"x" * 10  # one chunk of two read
    head, payload = next(messages)
    assert head == {"n": 2} and [bytes(c) for c in payload] == [b"z"]
    assert next(messages, None) is None


def test_a_stream_of_several_must_still_open_with_a_header():
    with pytest.raises(frames.FrameError, match="must start with a header"):
        list(frames.split_many(iter([frames.data(b"stray")])))
