"""wire/guard.py's reading of requests: each message decoded as its type, each read within its
deadline. The deadlines here are tiny so that a stall ends the test at once; nothing is timed."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from atoll.wire import messages as msg
from atoll.wire.guard import BadMessage, Deadlines, Reader, Stalled, _decoder

STALL = object()
QUICK = Deadlines(first_s=0.01, next_s=0.01)


class Context:
    """A call's context as the reader uses it: read() the next request message."""

    def __init__(self, *messages):
        self.messages = list(messages)

    async def read(self):
        if not self.messages:
            return grpc.aio.EOF
        item = self.messages.pop(0)
        if item is STALL:
            await asyncio.Event().wait()  # a client that sends nothing more
        return item


def _all(reader: Reader) -> list:
    async def read():
        return [item async for item in reader]
    return asyncio.run(read())


def test_messages_are_decoded_as_their_type_until_the_end():
    raw = [msg.Json(body='{"op": "whoami"}').SerializeToString(), b""]
    got = _all(Reader(Context(*raw), _decoder("Json"), QUICK))
    assert got == [msg.Json(body='{"op": "whoami"}'), msg.Json()]


def test_frames_pass_as_received():
    frame = b"\x12\x03abc"
    (got,) = _all(Reader(Context(frame), _decoder("Frame"), QUICK))
    assert got is frame  # no copy


def test_a_message_that_does_not_decode_is_refused():
    with pytest.raises(BadMessage, match=r"not a valid atoll\.v1\.SiteEvent"):
        _all(Reader(Context(b"\x0a\x05ab"), _decoder("SiteEvent"), QUICK))


def test_a_client_silent_from_the_start_meets_the_first_deadline():
    with pytest.raises(Stalled, match="nothing for 0.01 s while it waited for the request"):
        _all(Reader(Context(STALL), _decoder("Json"), QUICK))


def test_each_later_message_has_its_own_deadline():
    reader = Reader(Context(b"", STALL), _decoder("Json"), Deadlines(first_s=600, next_s=0.01))
    with pytest.raises(Stalled, match="the next message of the stream"):
        _all(reader)


def test_a_handler_on_a_thread_reads_through_the_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        reader = Reader(Context(b"\x0a\x01x", b"\x12\x01y"), _decoder("Frame"), QUICK)
        assert list(reader.blocking(loop, first=b"head")) == [b"head", b"\x0a\x01x", b"\x12\x01y"]
        stalled = Reader(Context(STALL), _decoder("Frame"), QUICK)
        with pytest.raises(Stalled):
            list(stalled.blocking(loop))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
