"""Frames: header-then-data messages, one per stream or several in a row; a small payload inline
with its header (a `Tasks` call)."""

from __future__ import annotations

import pytest

from atoll.wire import atoll_pb2, frames


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


def test_a_payload_inline_with_its_header_is_one_valid_frame_message():
    raw = frames.header({"task_id": "t1", "bytes": 3}, b"abc")
    head, inline = frames.read_message(raw)
    assert head == {"task_id": "t1", "bytes": 3} and bytes(inline) == b"abc"
    parsed = atoll_pb2.Frame.FromString(raw)  # what protobuf makes of it: header and inline
    assert (parsed.header, parsed.inline) == ('{"task_id":"t1","bytes":3}', b"abc")
    assert frames.read_message(frames.header({"none": True})) == ({"none": True}, None)
    assert bytes(frames.read_message(frames.header({}, b""))[1]) == b""


@pytest.mark.parametrize("raw", [
    frames.header({"a": 1}) + b"\x1a\x04abc",  # shorter than it says
    frames.header({"a": 1}) + b"\x1a\x02abc",  # longer
    frames.header({"a": 1}) + b"\x12\x01a",  # a data field, not inline
    frames.data(b"abc"),  # no header
    frames.header({"a": 1}) + b"\x1a" + frames.varint(frames.INLINE_MAX + 1)
    + b"x" * (frames.INLINE_MAX + 1),
], ids=["short", "long", "data field", "no header", "over the limit"])
def test_a_message_out_of_the_inline_shape_is_refused(raw):
    with pytest.raises(frames.FrameError):
        frames.read_message(raw)


def test_a_header_with_a_payload_inline_is_no_header_where_none_may_come():
    with pytest.raises(frames.FrameError):
        frames.read_header(frames.header({"a": 1}, b"abc"))
    with pytest.raises(frames.FrameError):
        frames.header({"a": 1}, b"x" * (frames.INLINE_MAX + 1))
