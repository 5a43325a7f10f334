"""Frames: one JSON header, then raw data chunks. The only payload format on atoll's wire.

A frame travels as the protobuf encoding of atoll.proto's `Frame` message, but atoll's own code
handles it as raw bytes (wire/rpc.py registers the Frame streams without a protobuf codec):
decoding a data frame is a view into the received message, and a relaying parent forwards the
bytes it received as they are. Through protobuf, every byte of a 1 GiB model was copied twice
more at each hop (parse on receive, serialize on send); measured on one gRPC stream here, raw
frames take 0.84 CPU-s per GiB instead of 1.40 (1.41 instead of 2.24 over TLS).

Payloads are streamed and never assembled in memory by a relay: gRPC's HTTP/2 flow control
pushes back on a fast sender.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError

CHUNK = 1024 * 1024  # 1 MiB: cheap per message, and little held in flight at each relay hop
MAX_MESSAGE = 8 * 1024 * 1024
# One control message (a command to a site, a site's report): half of MAX_MESSAGE, so that a
# command never comes near the limit that would break the link. Payloads are streamed instead.
MAX_CONTROL = MAX_MESSAGE // 2

HEADER_TAG = 0x0A  # field 1 (header), length-delimited
DATA_TAG = 0x12  # field 2 (data), length-delimited
INLINE_TAG = 0x1A  # field 3 (inline), length-delimited: after a header, a small payload whole
# The largest payload a `Tasks` call carries inside its header's message: a small model's round
# is then one message each way (issue 40: at 10,000 sites the messages are the server's cost).
INLINE_MAX = 64 * 1024


class FrameError(AtollError):
    """A stream did not follow the header-then-data shape."""

    exit_code = EXIT_INVALID


def varint(n: int) -> bytes:
    """protobuf's base-128 encoding of a non-negative integer."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes | memoryview, pos: int, max_bytes: int = 10) -> tuple[int, int] | None:
    """(value, position after it) of the varint at ``data[pos]``; None if it is cut short or
    longer than ``max_bytes``."""
    value = 0
    for i in range(max_bytes):
        if pos + i >= len(data):
            return None
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos + i + 1
    return None


def _lead(raw: bytes | memoryview) -> tuple[int, int, int]:
    """(tag, offset of the value, value length) from the start of one encoded Frame."""
    if len(raw) < 2 or raw[0] not in (HEADER_TAG, DATA_TAG):
        raise FrameError("not a frame: expected a header or a data field")
    found = read_varint(raw, 1, max_bytes=6)  # 42 bits: far past any frame's length
    if found is None:
        raise FrameError("not a frame: bad length")
    size, pos = found
    return raw[0], pos, size


def _parse(raw: bytes | memoryview) -> tuple[int, int]:
    """(tag, offset of the value) of one encoded Frame; the value must fill the rest exactly."""
    tag, pos, size = _lead(raw)
    if pos + size != len(raw):
        raise FrameError("not a frame: its length does not match the message")
    return tag, pos


def frame_size(start: bytes) -> int:
    """The whole length of the frame that begins with these bytes (its first 11 or more)."""
    _, pos, size = _lead(start)
    if size > MAX_MESSAGE:
        raise FrameError(f"not a frame: {size} bytes is over the {MAX_MESSAGE} limit")
    return pos + size


def header(body: dict[str, Any], inline: bytes | bytearray | memoryview | None = None) -> bytes:
    """A header frame; with `inline`, a payload of at most INLINE_MAX bytes in the same
    message (only a `Tasks` call carries one: read it with read_message)."""
    text = json.dumps(body, separators=(",", ":")).encode()
    lead = bytes((HEADER_TAG,)) + varint(len(text))
    if inline is None:
        return lead + text
    if len(inline) > INLINE_MAX:
        raise FrameError(f"an inline payload is at most {INLINE_MAX} bytes, not {len(inline)}")
    return b"".join((lead, text, bytes((INLINE_TAG,)), varint(len(inline)), inline))


def data_lead(size: int) -> bytes:
    """What comes before a data frame's bytes: its tag and length."""
    return bytes((DATA_TAG,)) + varint(size)


def data(chunk: bytes | bytearray | memoryview) -> bytes:
    """One data frame (the one copy of the chunk a sender makes)."""
    return b"".join((data_lead(len(chunk)), chunk))


def data_pieces(chunks: Iterable[bytes | bytearray | memoryview]
                ) -> Iterator[tuple[bytes, memoryview]]:
    """Arbitrary chunks re-sliced into data frames of at most CHUNK bytes, each as its lead and
    a view of its bytes, not yet joined (a file writer writes both as they are)."""
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, len(view), CHUNK):
            piece = view[start : start + CHUNK]
            yield data_lead(len(piece)), piece


def data_frames(chunks: Iterable[bytes | bytearray | memoryview]) -> Iterator[bytes]:
    """Re-slice arbitrary chunks into data frames of at most CHUNK bytes."""
    for lead, piece in data_pieces(chunks):
        yield b"".join((lead, piece))


def payload_frames(head: dict[str, Any], chunks: Iterable[Any] = ()) -> Iterator[bytes]:
    yield header(head)
    yield from data_frames(chunks)


class Payload:
    """The data frames after a header: iterate for the chunks (views, no copy), or take
    `frames()` to forward the encoded frames unchanged. Either way, once."""

    def __init__(self, frames: Iterator[bytes]):
        self._frames = frames

    def frames(self) -> Iterator[bytes]:
        for raw in self._frames:
            yield data_only(raw)

    def __iter__(self) -> Iterator[memoryview]:
        for raw in self._frames:
            yield data_view(raw)


def is_data(raw: bytes | memoryview) -> bool:
    """Whether raw is a data frame (else a header; FrameError if it is neither)."""
    return _parse(raw)[0] == DATA_TAG


def data_only(raw: bytes) -> bytes:
    """raw itself, if it is a data frame: what may follow a payload's header."""
    if _parse(raw)[0] != DATA_TAG:
        raise FrameError("a second header frame inside a payload")
    return raw


def split(frames: Iterator[bytes]) -> tuple[dict[str, Any], Payload]:
    """Read the header; return it with the rest of the stream as a Payload."""
    try:
        first = next(frames)
    except StopIteration:
        raise FrameError("empty stream: expected a header frame") from None
    return read_header(first), Payload(frames)


def split_many(frames: Iterable[bytes]) -> Iterator[tuple[dict[str, Any], Payload]]:
    """Several header-then-data messages in one stream, one after the other. Read each Payload
    (or leave it) before taking the next message: what it leaves unread is skipped."""
    frames = iter(frames)
    pushed_back: list[bytes] = []

    def data() -> Iterator[bytes]:
        for raw in frames:
            if _parse(raw)[0] != DATA_TAG:
                pushed_back.append(raw)  # the next message's header
                return
            yield raw

    raw = next(frames, None)
    while raw is not None:
        yield read_header(raw), Payload(data())
        raw = pushed_back.pop() if pushed_back else next(frames, None)
        while raw is not None and _parse(raw)[0] == DATA_TAG:  # the last payload's unread rest
            raw = next(frames, None)


def read_header(first: bytes) -> dict[str, Any]:
    """The JSON object in a stream's first frame, which must be a header."""
    tag, start = _parse(first)
    if tag != HEADER_TAG:
        raise FrameError("stream must start with a header frame")
    return _json(memoryview(first)[start:])


def read_message(raw: bytes) -> tuple[dict[str, Any], memoryview | None]:
    """A header frame's JSON object and the payload its message carries inline, if any (a view,
    at most INLINE_MAX bytes)."""
    tag, pos, size = _lead(raw)
    if tag != HEADER_TAG:
        raise FrameError("expected a header frame")
    end = pos + size
    if end == len(raw):
        return _json(memoryview(raw)[pos:end]), None
    if end > len(raw) or raw[end] != INLINE_TAG:
        raise FrameError("not a frame: its length does not match the message")
    found = read_varint(raw, end + 1, max_bytes=6)
    if found is None or found[0] + found[1] != len(raw):
        raise FrameError("not a frame: its inline payload's length does not match the message")
    if found[0] > INLINE_MAX:
        raise FrameError(f"an inline payload is at most {INLINE_MAX} bytes, not {found[0]}")
    return _json(memoryview(raw)[pos:end]), memoryview(raw)[found[1]:]


def data_view(raw: bytes) -> memoryview:
    """A data frame's bytes, without a copy."""
    tag, start = _parse(raw)
    if tag != DATA_TAG:
        raise FrameError("a second header frame inside a payload")
    return memoryview(raw)[start:]


def _json(text: memoryview) -> dict[str, Any]:
    try:
        head = json.loads(bytes(text))
    except ValueError as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    except RecursionError:  # nested deeper than Python's stack: a peer's garbage, not a crash
        raise FrameError("header is not JSON: nested too deep") from None
    if not isinstance(head, dict):
        raise FrameError("header must be a JSON object")
    return head


def file_chunks(path: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            yield block


def file_frames(path: Path) -> Iterator[bytes]:
    """A file's bytes as data frames."""
    return data_frames(file_chunks(path))


def write_chunks(chunks: Iterable[Any], path: Path, limit: int | None = None) -> int:
    """Write chunks to path (via a temporary name); enforce a size limit. Returns the size."""
    tmp = path.with_name(path.name + ".part")
    size = 0
    try:
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                size += len(chunk)
                if limit is not None and size > limit:
                    raise FrameError(f"payload larger than the limit of {limit} bytes")
                fh.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size
