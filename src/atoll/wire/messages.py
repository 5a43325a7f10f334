"""atoll.proto's control messages, encoded and decoded without the protobuf runtime.

Every message besides `Frame` (wire/frames.py) is one of a handful of shapes: a JSON string, a
oneof of JSON strings, a job id, a job id with a wait. Loading protobuf's runtime and the
generated module for them cost each parent 2.8 MiB of its 40 MiB budget at rest and every CLI
command and process start about 30 ms of import (measured here: `import grpc` alone 25.1 MiB,
with atoll_pb2 27.9 MiB). So the wire format stays protobuf, atoll.proto stays the contract
(other implementations generate from it, and `make proto-check` keeps the committed
atoll_pb2.py current), and these classes speak it directly. tests/unit/wire/test_messages.py
checks every message byte for byte against the generated code, and the service table in
wire/rpc.py against the proto's descriptors.

The classes keep the generated API that atoll uses: keyword construction, attributes,
`WhichOneof("kind")`, `SerializeToString()` and `FromString(data)`. Decoding follows
protobuf's rules: fields in any order, the last value of a field wins, a oneof holds the last
member seen, unknown fields are skipped, strings must be UTF-8.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.wire.frames import read_varint, varint

_STRING, _DOUBLE = "string", "double"
_LEN, _FIXED64, _VARINT, _FIXED32 = 2, 1, 0, 5  # protobuf wire types
_DEFAULTS = {_STRING: "", _DOUBLE: 0.0}


class DecodeError(AtollError, ValueError):
    """Bytes that are not an encoding of the message they were read as."""

    exit_code = EXIT_INVALID


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    found = read_varint(data, pos)
    if found is None:
        raise DecodeError("truncated or overlong varint")
    return found


def _fields(data: bytes):
    """(field number, wire type, value) of each field; a wire type proto3 does not use (the
    groups) is a DecodeError."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError("field number 0")
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire == _FIXED64:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == _LEN:
            size, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == _FIXED32:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise DecodeError("truncated message")
        yield number, wire, value


class Message:
    """One message type: FIELDS in field-number order, each (name, number, type); ONEOF names
    the oneof that holds every field, or is None for plain proto3 fields."""

    FIELDS: ClassVar[tuple[tuple[str, int, str], ...]] = ()
    ONEOF: ClassVar[str | None] = None
    _TYPES: ClassVar[dict[str, str]] = {}  # name -> type, from FIELDS
    _BY_NUMBER: ClassVar[dict[int, tuple[str, str]]] = {}  # number -> (name, type)
    __slots__ = ("_values",)  # what was set; a oneof's holds at most its one member

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls._TYPES = {name: kind for name, _, kind in cls.FIELDS}
        cls._BY_NUMBER = {number: (name, kind) for name, number, kind in cls.FIELDS}

    def __init__(self, **values: Any):
        self._values: dict[str, Any] = {}
        for name, value in values.items():
            kind = self._TYPES.get(name)
            if kind is None:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            if kind == _STRING and not isinstance(value, str):
                raise TypeError(f"{type(self).__name__}.{name} must be str, not "
                                f"{type(value).__name__}")
            if kind == _DOUBLE:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError(f"{type(self).__name__}.{name} must be a number")
                value = float(value)
            if self.ONEOF is not None:  # setting a member clears the others
                self._values.clear()
            self._values[name] = value

    def __getattr__(self, name: str) -> Any:
        kind = type(self)._TYPES.get(name)
        if kind is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        return self._values.get(name, _DEFAULTS[kind])

    def WhichOneof(self, group: str) -> str | None:  # noqa: N802 - protobuf's name
        if group != self.ONEOF:
            raise ValueError(f"{type(self).__name__} has no oneof {group!r}")
        return next(iter(self._values), None)

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name
        out = bytearray()
        for name, number, kind in self.FIELDS:
            if name not in self._values:
                continue
            value = self._values[name]
            if kind == _STRING:
                if not value and self.ONEOF is None:  # proto3: defaults are not sent
                    continue
                raw = value.encode("utf-8")
                out += varint(number << 3 | _LEN) + varint(len(raw)) + raw
            else:
                raw = struct.pack("<d", value)
                if raw == bytes(8) and self.ONEOF is None:  # 0.0 (but not -0.0) is the default
                    continue
                out += varint(number << 3 | _FIXED64) + raw
        return bytes(out)

    @classmethod
    def FromString(cls, data: bytes) -> Message:  # noqa: N802 - protobuf's name
        values: dict[str, Any] = {}
        for number, wire, value in _fields(bytes(data)):
            name, kind = cls._BY_NUMBER.get(number, (None, None))
            if kind == _STRING and wire == _LEN:
                try:
                    values[name] = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise DecodeError(f"{cls.__name__}.{name} is not valid UTF-8") from None
            elif kind == _DOUBLE and wire == _FIXED64:
                values[name] = struct.unpack("<d", value)[0]
            else:
                continue  # unknown to this version (or of another type): skipped
            if cls.ONEOF is not None:
                values = {name: values[name]}
        return cls(**values)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values == self._values

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"{type(self).__name__}({inner})"


class Json(Message):
    FIELDS = (("body", 1, _STRING),)


class SiteEvent(Message):
    FIELDS = (("hello", 1, _STRING), ("heartbeat", 2, _STRING), ("job_state", 3, _STRING))
    ONEOF = "kind"


class ServerCommand(Message):
    FIELDS = (("welcome", 1, _STRING), ("dispatch", 2, _STRING), ("abort", 3, _STRING),
              ("end", 4, _STRING), ("revocations", 5, _STRING), ("forget", 6, _STRING))
    ONEOF = "kind"


class JobRef(Message):
    FIELDS = (("job_id", 1, _STRING),)


class PullRequest(Message):
    FIELDS = (("job_id", 1, _STRING), ("wait_s", 2, _DOUBLE))
