"""Who is calling: identity, org and role come from the verified client certificate only."""

from __future__ import annotations

from functools import lru_cache

import grpc

from atoll.pki.identity import Identity, identity_from_cert


@lru_cache(maxsize=1024)
def _identity(pem: bytes) -> Identity:
    return identity_from_cert(pem)


def peer_identity(context: grpc.ServicerContext, kind: str) -> Identity:
    """The caller's identity; aborts the call unless its certificate is of the expected kind."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
    identity = _identity(pems[0])
    if identity.kind != kind:
        context.abort(grpc.StatusCode.PERMISSION_DENIED,
                      f"{identity.name} holds a {identity.kind} certificate; this call needs a "
                      f"{kind} certificate")
    return identity
