"""Errors a user of the CLI or the Session API meets; each message says what to do next.

    AtollError
     ├── ConnectionFailed   the server cannot be reached
     ├── AuthError          certificate or session refused (run `atoll login`)
     ├── Refused            not allowed, or the request is invalid (message names the field)
     └── NotFound           no such job (also for another study's job)
"""

from __future__ import annotations


class AtollError(Exception):
    exit_code = 1


class ConnectionFailed(AtollError):
    exit_code = 3


class AuthError(AtollError):
    exit_code = 4


class Refused(AtollError):
    exit_code = 2


class NotFound(AtollError):
    exit_code = 5


def from_rpc_error(exc, server: str) -> AtollError:
    """Translate a gRPC failure into a sentence; the one place the CLI and Session do this."""
    import grpc

    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectionFailed(
            f"cannot reach the server at {server} ({details.splitlines()[0] if details else code.name}); "
            "is it running (`atoll server start KIT`) and is the address in your kit right?")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AuthError(f"{details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Refused(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(details)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return Refused(details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ConnectionFailed(f"the server at {server} did not answer in time")
    return AtollError(f"{code.name}: {details}")
