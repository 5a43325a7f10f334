"""gRPC failures from a real in-process server become the CLI's and Session's errors
(admin/errors.py: from_rpc_error), each with its exit code and a sentence to act on."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from atoll.admin.errors import (
    AtollError,
    AuthError,
    ConnectionFailed,
    NotFound,
    Refused,
    from_rpc_error,
)


def _fail(request: bytes, context: grpc.ServicerContext) -> bytes:
    code = grpc.StatusCode[request.decode()]
    context.abort(code, f"the server says {code.name.lower()}\nsecond line")


def _slow(request: bytes, context: grpc.ServicerContext) -> bytes:
    while context.is_active():  # until the caller's deadline passes
        time.sleep(0.01)
    return b""


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    methods = {"Fail": grpc.unary_unary_rpc_method_handler(_fail),
               "Slow": grpc.unary_unary_rpc_method_handler(_slow)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Test", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def _error_of(address: str, method: str, request: bytes, timeout: float = 10) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(f"/t.Test/{method}")(request, timeout=timeout)
    return caught.value


@pytest.mark.parametrize(("code", "kind", "exit_code"), [
    ("UNAUTHENTICATED", AuthError, 4),
    ("PERMISSION_DENIED", Refused, 2),
    ("NOT_FOUND", NotFound, 5),
    ("INVALID_ARGUMENT", Refused, 2),
    ("FAILED_PRECONDITION", Refused, 2),
])
def test_a_refusal_keeps_the_servers_words(address, code, kind, exit_code):
    error = from_rpc_error(_error_of(address, "Fail", code.encode()), address)
    assert type(error) is kind and error.exit_code == exit_code
    assert str(error) == f"the server says {code.lower()}\nsecond line"


def test_an_unexpected_code_is_named_with_the_details(address):
    error = from_rpc_error(_error_of(address, "Fail", b"INTERNAL"), address)
    assert type(error) is AtollError and error.exit_code == 1
    assert str(error) == "INTERNAL: the server says internal\nsecond line"


def test_unavailable_names_the_server_and_the_first_line_only(address):
    error = from_rpc_error(_error_of(address, "Fail", b"UNAVAILABLE"), "fl.example.org:8443")
    assert type(error) is ConnectionFailed and error.exit_code == 3
    assert str(error).startswith("cannot reach the server at fl.example.org:8443 "
                                 "(the server says unavailable); is it running")


def test_a_server_that_is_not_there_is_a_connection_failure():
    with socket.socket() as probe:  # a port nobody listens on any more
        probe.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{probe.getsockname()[1]}"
    error = from_rpc_error(_error_of(gone, "Fail", b"OK", timeout=10), gone)
    assert type(error) is ConnectionFailed
    assert f"cannot reach the server at {gone}" in str(error)
    assert "`atoll server start KIT`" in str(error)


def test_a_server_that_does_not_answer_in_time(address):
    error = from_rpc_error(_error_of(address, "Slow", b"", timeout=0.3), "fl.example.org:8443")
    assert type(error) is ConnectionFailed
    assert str(error) == "the server at fl.example.org:8443 did not answer in time"
