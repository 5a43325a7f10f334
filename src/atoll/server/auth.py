"""Who is calling: identity, org and role come from the verified client certificate only."""

from __future__ import annotations

from functools import lru_cache

import grpc

from atoll.pki.identity import Identity, IdentityError, identity_from_cert, identity_from_subject


@lru_cache(maxsize=1024)
def _identity(pem: bytes) -> Identity:
    return identity_from_cert(pem)


def peer_identity(context: grpc.ServicerContext, kind: str) -> Identity:
    """The caller's identity; aborts the call unless its certificate is of the expected kind."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert")
    if not pems:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
    try:
        subjects = auth.get("x509_subject")
        identity = (identity_from_subject(subjects[0].decode()) if subjects
                    else _identity(pems[0]))
    except IdentityError as exc:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, f"certificate refused: {exc}")
    if identity.kind != kind:
        context.abort(grpc.StatusCode.PERMISSION_DENIED,
                      f"{identity.name} holds a {identity.kind} certificate; this call needs a "
                      f"{kind} certificate")
    return identity
