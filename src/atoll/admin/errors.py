"""Errors a user of the CLI or the Session API meets; each message says what to do next.

They derive from atoll's one error root, ``atoll.spec.errors.AtollError`` (re-exported here),
and exit with the codes of its table:

    AtollError (atoll.spec.errors)   exit 1
     ├── ConnectionFailed   exit 3: the server cannot be reached
     ├── AuthError          exit 4: certificate or session refused (run `atoll login`)
     ├── Refused            exit 2: not allowed, or the request is invalid (names the field)
     └── NotFound           exit 5: no such job (also for another study's job)
"""

from __future__ import annotations

from atoll.spec.errors import (
    EXIT_AUTH,
    EXIT_CONNECTION,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    AtollError,
)

__all__ = ["AtollError", "AuthError", "ConnectionFailed", "NotFound", "Refused", "from_rpc_error"]


class ConnectionFailed(AtollError):
    exit_code = EXIT_CONNECTION


class AuthError(AtollError):
    exit_code = EXIT_AUTH


class Refused(AtollError):
    exit_code = EXIT_INVALID


class NotFound(AtollError):
    exit_code = EXIT_NOT_FOUND


def from_rpc_error(exc, server: str) -> AtollError:
    """Translate a gRPC failure into a sentence; the one place the CLI and Session do this."""
    import grpc

    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and "Hostname Verification" in details:
        return ConnectionFailed(
            f"the server at {server} answered with a certificate that does not hold that name; "
            "if the server moved, its project admin re-issues its certificate for the new name "
            "(`atoll provision move-server DIR/PROJECT --host NAME`, docs/provisioning.md)")
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
