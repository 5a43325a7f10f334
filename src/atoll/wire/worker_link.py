"""The worker's side of the link to its parent: the channel it dials (TLS pinned to the
parent's certificate when it has one) and the metadata keys both sides use
(the parent's side: parent/worker_endpoint.py)."""

from __future__ import annotations

import grpc

SESSION_KEY = "x-atoll-worker"
# NextReply: a workflow that sends this ("1") takes every reply already waiting in one call,
# one header-then-data message after the other (frames.split_many); else one reply per call.
MANY_REPLIES_KEY = "x-atoll-replies"
# NextReply, NextTask: a worker that sends this ("1") takes replies or tasks as files in the
# handoff folder its parent offered at registration (wire/handoff.py), each header naming its
# file. A worker sends its own payloads that way by naming the file in the payload's header.
HANDOFF_KEY = "x-atoll-handoff"


UNIX_PREFIX = "unix:"


def worker_channel(address: str, cert_pem: str | None) -> grpc.Channel:
    """The worker's channel to its parent: TLS pinned to the parent's certificate if it has one;
    a ``unix:`` address is the parent's socket bound into the worker's sandbox (no TLS: nothing
    but the worker and its parent can reach it)."""
    from atoll.wire.grpc_setup import OPTIONS

    if cert_pem and not address.startswith(UNIX_PREFIX):
        creds = grpc.ssl_channel_credentials(root_certificates=cert_pem.encode())
        return grpc.secure_channel(address, creds, options=OPTIONS)
    return grpc.insecure_channel(address, options=OPTIONS)
