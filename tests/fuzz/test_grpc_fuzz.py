"""A raw gRPC client with real certificates against a live server and site (issue 20): streams
cut short, oversized messages, garbage and half-valid protobuf frames, calls out of order
(Federation calls before a site's hello, Admin calls without or with someone else's session,
worker calls before registration). Each must be answered with a clear status, and the server
must go on answering others.

`make test` runs a sample of 150 calls; `make fuzz` (ATOLL_FUZZ_EXAMPLES) runs more.
"""

from __future__ import annotations

import json
import os
import struct
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atoll.pki.kit import load_kit
from atoll.pki.tls import channel_credentials
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from tests.integration.federation.harness import Federation, free_port

EXAMPLES = int(os.environ.get("ATOLL_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LEAD, MEMBER, WATCHER = "lead@fuzz.org", "member@fuzz.org", "watcher@fuzz.org"
USERS = [{"name": LEAD, "org": "fuzz", "role": "lead"},
         {"name": MEMBER, "org": "fuzz", "role": "member"},
         {"name": WATCHER, "org": "fuzz", "role": "project_admin"}]
CALLERS = ["site-1", LEAD, MEMBER]  # WATCHER only checks that the server still answers
CALL_TIMEOUT_S = 30  # a hang guard: a call the server leaves unanswered this long is a failure
# A crash answered as such, a dead or hung server, a call the server left to time out.
BROKEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE,
          grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
          grpc.StatusCode.UNIMPLEMENTED}
METHODS = [(service, name) for service in ("Federation", "Admin") for name in rpc.SERVICES[service]]


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("grpcfuzz"), ["site-1"], USERS)
    port = free_port()  # a known port for the site's worker endpoint
    with open(fed.kit("site-1") / "local" / "site.yaml", "a") as fh:
        fh.write(f"\nworker_endpoint: {{host: 127.0.0.1, port: {port}}}\n")
    fed.start_all()
    fed.wait_online(WATCHER)
    fed.worker_port = port
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def channels(fed):
    opened = {}
    for name in [*CALLERS, WATCHER]:
        kit = load_kit(fed.kit(name))
        opened[name] = grpc.secure_channel(kit.server_address, channel_credentials(kit))
    yield opened
    for channel in opened.values():
        channel.close()


@pytest.fixture(scope="module")
def tokens(fed):
    """A real session token of the lead's, to be sent by others too."""
    with fed.session(LEAD, study="default") as s:
        return {"lead": s.token}


# -- what the client sends -----------------------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                   max_size=4),
    max_leaves=12)
KEYS = ["op", "study", "job_id", "since", "wait_s", "name", "user", "site", "limit", "event",
        "headers", "task_id", "token", "only_study", "running_jobs"]
OPS = ["login", "whoami", "list_jobs", "job_status", "job_logs", "abort_job", "list_sites",
       "audit", "study_list", "study_show", "study_create", "study_add_user", "nope"]


@st.composite
def json_texts(draw) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.text(max_size=40))  # not JSON, mostly
    if kind == 1:
        return json.dumps(draw(JSON_VALUES))
    if kind == 2:
        return "[" * draw(st.sampled_from([10, 1000, 100_000]))  # deep
    body = draw(st.dictionaries(st.sampled_from(KEYS), JSON_VALUES, max_size=5))
    if kind >= 4:
        body["op"] = draw(st.sampled_from(OPS))
    if draw(st.booleans()):
        body["job_id"] = draw(st.sampled_from(["0" * 32, "x", "../../etc"]))
    if draw(st.booleans()):
        body["wait_s"] = draw(st.sampled_from([0.01, 1e308, -1.0, "soon"]))
        body["since"] = draw(st.integers(-1, 3))
    return json.dumps(body)


def _field(number: int, payload: bytes) -> bytes:
    return frames.varint(number << 3 | 2) + frames.varint(len(payload)) + payload


@st.composite
def messages(draw) -> bytes:
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return draw(st.binary(max_size=64))  # garbage
    if kind == 1:  # a valid Json, SiteEvent or Frame header with generated JSON inside
        return _field(draw(st.integers(1, 3)), draw(json_texts()).encode())
    if kind == 2:  # a data frame
        return frames.data(draw(st.binary(max_size=256)))
    if kind == 3:  # a field whose declared length runs past the message
        payload = draw(st.binary(max_size=16))
        return frames.varint(1 << 3 | 2) + frames.varint(len(payload) + 5) + payload
    if kind == 4:  # a PullRequest with any wait, NaN and infinities included
        wait = draw(st.floats(allow_nan=True, allow_infinity=True))
        return _field(1, b"0" * 32) + frames.varint(2 << 3 | 1) + struct.pack("<d", wait)
    if kind == 5:  # not UTF-8 where a string is expected
        return _field(1, b"\xff\xfe" + draw(st.binary(max_size=8)))
    if kind == 6:  # an unknown field, then a wire type protobuf does not use
        return frames.varint(9 << 3 | 2) + b"\x01x" + bytes([3 << 3 | 3])
    return b""  # an empty message: every field at its default


@st.composite
def calls(draw) -> tuple[str, str, str, list[bytes], tuple]:
    caller = draw(st.sampled_from(CALLERS))
    service, method = draw(st.sampled_from(METHODS))
    sent = draw(st.lists(messages(), max_size=4))
    session = draw(st.sampled_from([None, "lead", "garbage", "v1.e30.x"]))
    return caller, service, method, sent, session


def _call(channel: grpc.Channel, service: str, method: str, sent: list[bytes],
          metadata: tuple = ()) -> tuple[grpc.StatusCode, str]:
    """Every method called as a bidirectional stream of raw bytes: any number of messages,
    the same bytes on the wire as its own client would send."""
    call = channel.stream_stream(f"/{rpc.PACKAGE}.{service}/{method}")
    try:
        for _ in call(iter(sent), metadata=metadata, timeout=CALL_TIMEOUT_S):
            pass
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _check(code: grpc.StatusCode, details: str, what) -> None:
    assert code not in BROKEN, (code, details, what)
    if code != grpc.StatusCode.OK:
        assert details.strip(), (code, what)
        assert "Traceback" not in details and "Unexpected <class" not in details, details


def _still_serving(channels) -> None:
    answer = rpc.stub(channels[WATCHER], "Admin").Call(
        msg.Json(body='{"op": "whoami"}'), timeout=CALL_TIMEOUT_S)
    assert json.loads(answer.body)["user"] == WATCHER


# -- the server ----------------------------------------------------------------------------------
def test_generated_calls_get_a_clear_answer_and_others_are_served(fed, channels, tokens):
    seen: dict[str, int] = {}

    @FUZZ
    @given(case=calls())
    def case(case) -> None:
        caller, service, method, sent, session = case
        token = tokens.get(session, session)
        metadata = (("x-atoll-session", token),) if token else ()
        code, details = _call(channels[caller], service, method, sent, metadata)
        seen[code.name] = seen.get(code.name, 0) + 1
        _check(code, details, case)
        _still_serving(channels)
        time.sleep(0.005)  # stay within one certificate's calls a second (server/auth.py)

    case()
    assert seen.get("INVALID_ARGUMENT") and seen.get("PERMISSION_DENIED"), seen


@pytest.mark.parametrize(("service", "method"), METHODS)
def test_calls_out_of_order_or_cut_short_are_answered(fed, channels, service, method):
    """No message at all; a site's calls before its hello; admin calls without a session."""
    caller = "site-1" if service == "Federation" else LEAD
    code, details = _call(channels[caller], service, method, [])
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK), (code, details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert "without a request message" in details or "header" in details, details
    _still_serving(channels)


def test_federation_calls_before_hello_find_nothing(fed, channels):
    site = channels["site-1"]
    hello_first = msg.SiteEvent(heartbeat="{}").SerializeToString()
    assert _call(site, "Federation", "Connect", [hello_first])[0] == \
        grpc.StatusCode.INVALID_ARGUMENT
    reply = [frames.header({"job_id": "0" * 32, "task_id": "t"}), frames.data(b"x")]
    assert _call(site, "Federation", "PushReply", reply)[0] == grpc.StatusCode.NOT_FOUND
    report = msg.Json(body='{"job_id": "nope", "event": {}}').SerializeToString()
    assert _call(site, "Federation", "Report", [report])[0] == grpc.StatusCode.NOT_FOUND
    pull = msg.PullRequest(job_id="nope", wait_s=float("nan")).SerializeToString()
    assert _call(site, "Federation", "PullTask", [pull]) == (grpc.StatusCode.OK, "")


def test_oversized_messages_are_refused_and_the_server_serves_on(fed, channels):
    big = b"\x0a" + frames.varint(9 << 20) + b"x" * (9 << 20)  # 9 MiB: over the 8 MiB limit
    for caller, service, method in [(LEAD, "Admin", "Call"), ("site-1", "Federation", "PushReply"),
                                    (LEAD, "Admin", "Submit")]:
        code, details = _call(channels[caller], service, method, [big])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        _still_serving(channels)
    fed.wait_online(WATCHER)  # and the site's own link stayed up or came back


def test_a_session_token_that_is_not_the_callers_is_refused(fed, channels, tokens):
    call = msg.Json(body='{"op": "list_jobs"}').SerializeToString()
    for token in (tokens["lead"], "v1.e30.x", "garbage"):
        code, details = _call(channels[MEMBER], "Admin", "Call", [call],
                              (("x-atoll-session", token),))
        assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
        assert "not issued to you" in details


# -- the site ------------------------------------------------------------------------------------
WORKER_METHODS = list(rpc.SERVICES["WorkerLink"])


@pytest.mark.parametrize("method", [m for m in WORKER_METHODS if m != "Register"])
def test_worker_calls_before_registration_are_refused(fed, method):
    with grpc.insecure_channel(f"127.0.0.1:{fed.worker_port}") as channel:
        request = msg.PullRequest(job_id="0" * 32, wait_s=1).SerializeToString()
        code, details = _call(channel, "WorkerLink", method, [request])
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
    assert "worker session" in details


def test_a_worker_token_that_was_never_issued_is_refused(fed):
    """A token never issued is refused; a registration that names no valid job id is refused
    before any token is looked at, naming the field."""
    with grpc.insecure_channel(f"127.0.0.1:{fed.worker_port}") as channel:
        for body, expected in (({"job_id": "0" * 32, "token": "x"}, grpc.StatusCode.PERMISSION_DENIED),
                               ({}, grpc.StatusCode.INVALID_ARGUMENT),
                               ({"job_id": 1, "token": None}, grpc.StatusCode.INVALID_ARGUMENT)):
            request = msg.Json(body=json.dumps(body)).SerializeToString()
            code, details = _call(channel, "WorkerLink", "Register", [request])
            assert code == expected, (body, code, details)
            if expected == grpc.StatusCode.INVALID_ARGUMENT:
                assert "is not a valid job id" in details, details
    fed.wait_online(WATCHER)  # the site parent serves on
