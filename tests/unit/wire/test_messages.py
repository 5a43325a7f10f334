"""wire/messages.py speaks exactly what the generated protobuf code speaks, and wire/rpc.py's
service table is atoll.proto's."""

from __future__ import annotations

import math
import struct
import subprocess
import sys

import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from hypothesis import given
from hypothesis import strategies as st

from atoll.wire import atoll_pb2 as pb
from atoll.wire import messages, rpc

TEXT = st.text(max_size=300)
ONEOFS = {"SiteEvent": ("hello", "heartbeat", "job_state"),
          "ServerCommand": ("welcome", "dispatch", "abort", "end", "revocations")}


def _both(name: str, **values):
    return getattr(messages, name)(**values), getattr(pb, name)(**values)


def _same(ours: messages.Message, theirs) -> None:
    """Every field, and the oneof, read the same on both sides."""
    for field in theirs.DESCRIPTOR.fields:
        a, b = getattr(ours, field.name), getattr(theirs, field.name)
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), field.name
    if ours.ONEOF:
        assert ours.WhichOneof("kind") == theirs.WhichOneof("kind")


@given(body=TEXT, job_id=TEXT)
def test_plain_messages_encode_as_protobuf_does_and_read_back(body, job_id):
    for name, values in (("Json", {"body": body}), ("JobRef", {"job_id": job_id})):
        ours, theirs = _both(name, **values)
        assert ours.SerializeToString() == theirs.SerializeToString()
        _same(getattr(messages, name).FromString(theirs.SerializeToString()), theirs)
        assert getattr(pb, name).FromString(ours.SerializeToString()) == theirs


@given(job_id=TEXT, wait_s=st.floats(allow_nan=True, allow_infinity=True))
def test_a_pull_request_with_any_wait_encodes_as_protobuf_does(job_id, wait_s):
    ours, theirs = _both("PullRequest", job_id=job_id, wait_s=wait_s)
    assert ours.SerializeToString() == theirs.SerializeToString()
    _same(messages.PullRequest.FromString(theirs.SerializeToString()), theirs)


@pytest.mark.parametrize("name", sorted(ONEOFS))
@given(data=st.data())
def test_every_oneof_member_encodes_as_protobuf_does_even_when_empty(name, data):
    member = data.draw(st.sampled_from(ONEOFS[name]))
    value = data.draw(TEXT)
    ours, theirs = _both(name, **{member: value})
    assert ours.SerializeToString() == theirs.SerializeToString()  # "" is sent: it is set
    decoded = getattr(messages, name).FromString(theirs.SerializeToString())
    _same(decoded, theirs)
    assert decoded.WhichOneof("kind") == member


def test_nothing_set_is_the_empty_message_with_defaults():
    for name in ("Json", "JobRef", "PullRequest", "SiteEvent", "ServerCommand"):
        ours, theirs = _both(name)
        assert ours.SerializeToString() == theirs.SerializeToString() == b""
        _same(getattr(messages, name).FromString(b""), theirs)
    assert messages.SiteEvent().WhichOneof("kind") is None
    assert messages.PullRequest(job_id="j").wait_s == 0.0


def test_negative_zero_is_sent_as_protobuf_sends_it():
    ours, theirs = _both("PullRequest", wait_s=-0.0)
    assert ours.SerializeToString() == theirs.SerializeToString() != b""


def test_the_last_oneof_member_on_the_wire_wins_and_unknown_fields_are_skipped():
    wire = (pb.SiteEvent(hello="h").SerializeToString()
            + b"\x78\x96\x01"  # field 15, varint: a field a later version might add
            + b"\x81\x01" + struct.pack("<d", 1.5)  # field 16, fixed64
            + b"\x8a\x01\x03abc"  # field 17, bytes
            + b"\x95\x01\x00\x00\x00\x00"  # field 18, fixed32
            + pb.SiteEvent(job_state="j").SerializeToString())
    ours, theirs = messages.SiteEvent.FromString(wire), pb.SiteEvent.FromString(wire)
    assert ours.WhichOneof("kind") == theirs.WhichOneof("kind") == "job_state"
    assert ours.job_state == "j" and ours.hello == ""
    # a repeated plain field: the last value wins
    assert messages.Json.FromString(b"\x0a\x01a\x0a\x01b").body == "b"


@pytest.mark.parametrize("wire", [
    b"\x0a\x05abc",  # shorter than its length says
    b"\x0a",  # a key and no length
    b"\x0a\x02\xff\xfe",  # not UTF-8
    b"\x11\x00\x00",  # fixed64 cut short
    b"\x0b",  # a group (wire type 3): not in proto3
    b"\x00\x01",  # field number 0
    b"\x08" + b"\xff" * 11,  # an endless varint
])
def test_broken_bytes_are_a_decode_error_as_in_protobuf(wire):
    with pytest.raises(messages.DecodeError):
        messages.Json.FromString(wire)
    with pytest.raises(ProtobufDecodeError):
        pb.Json.FromString(wire)


def test_wrong_types_and_unknown_fields_are_refused_at_construction():
    with pytest.raises(TypeError, match="body must be str"):
        messages.Json(body=b"bytes")
    with pytest.raises(TypeError, match="no field 'bdy'"):
        messages.Json(bdy="x")
    with pytest.raises(TypeError, match="must be a number"):
        messages.PullRequest(wait_s="5")
    with pytest.raises(ValueError, match="no oneof"):
        messages.SiteEvent().WhichOneof("other")


def test_the_message_classes_are_the_protos_messages_field_for_field():
    ours = {name for name in vars(messages) if isinstance(getattr(messages, name), type)
            and issubclass(getattr(messages, name), messages.Message)
            and getattr(messages, name) is not messages.Message}
    assert ours == set(pb.DESCRIPTOR.message_types_by_name) - {rpc.RAW}
    for name in ours:
        cls, desc = getattr(messages, name), pb.DESCRIPTOR.message_types_by_name[name]
        assert [(f, n) for f, n, _ in cls.FIELDS] == [(f.name, f.number) for f in desc.fields]
        assert cls.ONEOF == (desc.oneofs[0].name if desc.oneofs else None)


def test_the_service_table_is_atoll_protos():
    assert set(rpc.SERVICES) == set(pb.DESCRIPTOR.services_by_name)
    for service, methods in rpc.SERVICES.items():
        desc = pb.DESCRIPTOR.services_by_name[service]
        assert desc.full_name == f"{rpc.PACKAGE}.{service}"
        assert methods == {m.name: (m.input_type.name, m.output_type.name, m.client_streaming,
                                    m.server_streaming) for m in desc.methods}


def test_stubs_and_servicers_load_no_protobuf():
    probe = ("import sys\nfrom atoll.wire import rpc\nimport atoll.server.admin_service, "
             "atoll.server.federation_service, atoll.site.connection, atoll.admin.session\n"
             "print(sorted(m for m in sys.modules if m.startswith('google')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
