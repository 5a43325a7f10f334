"""Frames: one JSON header, then raw data chunks. The only payload format on atoll's wire.

Payloads are streamed and never assembled in memory by a relay: a parent forwards frames as
they arrive, and gRPC's HTTP/2 flow control pushes back on a fast sender.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from atoll.wire import atoll_pb2 as pb

CHUNK = 1024 * 1024  # 1 MiB: cheap per message, and little held in flight at each relay hop
MAX_MESSAGE = 8 * 1024 * 1024


class FrameError(Exception):
    """A stream did not follow the header-then-data shape."""


def header(body: dict[str, Any]) -> pb.Frame:
    return pb.Frame(header=json.dumps(body, separators=(",", ":")))


def data_frames(chunks: Iterable[bytes | bytearray | memoryview]) -> Iterator[pb.Frame]:
    """Re-slice arbitrary chunks into frames of at most CHUNK bytes."""
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, len(view), CHUNK):
            yield pb.Frame(data=bytes(view[start : start + CHUNK]))


def payload_frames(head: dict[str, Any], chunks: Iterable[Any] = ()) -> Iterator[pb.Frame]:
    yield header(head)
    yield from data_frames(chunks)


def split(frames: Iterator[pb.Frame]) -> tuple[dict[str, Any], Iterator[bytes]]:
    """Read the header; return it with an iterator over the remaining data chunks."""
    try:
        first = next(frames)
    except StopIteration:
        raise FrameError("empty stream: expected a header frame") from None
    if first.WhichOneof("kind") != "header":
        raise FrameError("stream must start with a header frame")
    try:
        head = json.loads(first.header)
    except ValueError as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    if not isinstance(head, dict):
        raise FrameError("header must be a JSON object")

    def rest() -> Iterator[bytes]:
        for frame in frames:
            if frame.WhichOneof("kind") != "data":
                raise FrameError("a second header frame inside a payload")
            yield frame.data

    return head, rest()


def file_chunks(path: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            yield block


def write_chunks(chunks: Iterable[bytes], path: Path, limit: int | None = None) -> int:
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
