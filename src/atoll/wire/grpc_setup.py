"""gRPC channel and server options shared by every atoll link."""

from __future__ import annotations

from concurrent import futures

import grpc

from atoll.wire.frames import MAX_MESSAGE

OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    # gRPC's own reconnect backoff starts at 1 s; a site started a moment before its server
    # would otherwise wait that long after the server is up. (Not min_reconnect_backoff_ms:
    # gRPC also uses it as the connect timeout, and a loaded machine needs more than 100 ms.)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    # A fixed 2 MiB flow-control window per stream instead of BDP probing, which grew windows
    # (and so what each relay hop buffers) to tens of MiB while a 100 MB payload passed.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 2 * 1024 * 1024),
    # HTTP/2 frames as large as the protocol allows (the default is 16 KiB): a 1 MiB payload
    # frame then crosses as a few HTTP/2 frames, not 64, and each receiver parses fewer. On one
    # TLS stream here (bench/compare/grpc_hop.py, two runs of 5-7 interleaved repeats) the
    # receiving side took 8-10 % less CPU per GiB, the sending side the same. The stream window
    # above still bounds what is in flight.
    ("grpc.http2.max_frame_size", 16 * 1024 * 1024 - 1),
]


def new_server(max_workers: int = 64) -> grpc.Server:
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        options=OPTIONS,
    )


def secure_channel(target: str, credentials: grpc.ChannelCredentials, server_name: str | None):
    options = list(OPTIONS)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(target, credentials, options=options)


def insecure_channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=OPTIONS)
