"""Who is calling: identity, org and role come from the verified client certificate only."""

from __future__ import annotations

from functools import lru_cache

import grpc

from atoll.pki.identity import Identity, IdentityError, identity_from_cert, identity_from_subject


class PeerRefused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


@lru_cache(maxsize=1024)
def _identity(pem: bytes) -> Identity:
    return identity_from_cert(pem)


def check_peer(context, kind: str) -> Identity:
    """The caller's identity; PeerRefused unless its certificate is of the expected kind."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert")
    if not pems:
        raise PeerRefused(grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
    try:
        subjects = auth.get("x509_subject")
        identity = (identity_from_subject(subjects[0].decode()) if subjects
                    else _identity(pems[0]))
    except IdentityError as exc:
        raise PeerRefused(grpc.StatusCode.PERMISSION_DENIED,
                          f"certificate refused: {exc}") from None
    if identity.kind != kind:
        raise PeerRefused(grpc.StatusCode.PERMISSION_DENIED,
                          f"{identity.name} holds a {identity.kind} certificate; this call needs "
                          f"a {kind} certificate")
    return identity


def peer_identity(context: grpc.ServicerContext, kind: str) -> Identity:
    """check_peer for a handler on a thread: a refused caller's call is aborted."""
    try:
        return check_peer(context, kind)
    except PeerRefused as exc:
        context.abort(exc.code, exc.details)
        raise  # abort raises; this line is never reached


async def peer_identity_async(context, kind: str) -> Identity:
    """check_peer for a handler on the event loop (whose context.abort is a coroutine)."""
    try:
        return check_peer(context, kind)
    except PeerRefused as exc:
        await context.abort(exc.code, exc.details)
        raise
