"""TensorBoard event files, written with the standard library alone.

TensorBoard reads scalars from files named ``events.out.tfevents.*``: TFRecord framing
(length, its masked CRC-32C, the bytes, their masked CRC-32C) around serialized ``Event``
protocol buffers. torch's SummaryWriter imports torch (1-2 s and hundreds of MiB in a server
worker that never trains) and tensorboard's own writer numpy and its plugins (0.4 s); the
few fields a scalar needs are encoded here instead:

    Event   {1: wall_time double, 2: step int64, 3: file_version string, 5: summary Summary}
    Summary {1: value repeated Value}
    Value   {1: tag string, 2: simple_value float}

(tensorboard/compat/proto/event.proto and summary.proto). The tests read the files back with
TensorBoard's own EventAccumulator.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

FILE_VERSION = b"brain.Event:2"


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """One TFRecord: what TensorBoard's reader checks, byte for byte."""
    length = struct.pack("<Q", len(data))
    return length + _masked(length) + data + _masked(data)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: a negative step is ten bytes of two's complement
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # length-delimited (wire type 2)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int = 0, *, file_version: bytes | None = None,
          scalars: dict[str, float] | None = None) -> bytes:
    """A serialized Event: the file's version line, or scalars at ``step``."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        out += _field(3, file_version)
    if scalars:
        values = b"".join(
            _field(1, _field(1, tag.encode("utf-8")) + b"\x15" + struct.pack("<f", value))
            for tag, value in scalars.items())
        out += _field(5, values)
    return out


class EventFileWriter:
    """One event file in ``folder`` (made when missing), as SummaryWriter names them."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.0"
        self.path = folder / name
        self._file = open(self.path, "ab")
        self._file.write(record(event(now, file_version=FILE_VERSION)))
        self._file.flush()

    def add_scalars(self, scalars: dict[str, float], step: int, wall_time: float) -> None:
        """Every scalar of one step, one event each (as add_scalar writes them)."""
        for tag, value in scalars.items():
            self._file.write(record(event(wall_time, step, scalars={tag: float(value)})))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
