"""The gRPC/TLS hop between two parents, alone: CPU seconds per GiB of raw frames pushed (a
site's reply) and pulled (a task), sender and receiver apart, for frame sizes and stream
windows side by side, interleaved.

The receiver runs in a child process on grpc.aio, as the server parent does; the sender is this
process on the synchronous API, as a site parent is; both with the parents' malloc settings. TLS with a throwaway certificate. CPU time
is read from each process (time.process_time), so the counts move little with the machine's
load; wall time is printed for context.

  .venv/bin/python -m bench.compare.grpc_hop --gib 1 --frames 1,4 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from atoll.wire import frames
from atoll.wire.grpc_setup import OPTIONS

SERVICE = "/bench.Hop/"


def _options(variant: str) -> list[tuple[str, int]]:
    """atoll's options with a variant's changes: "base", or "key=int;key=int" (gRPC's channel
    arguments, e.g. grpc.http2.lookahead_bytes=8388608); a variant named "insecure..." runs
    without TLS; "tls-socket" sends the same bytes over a plain TLS socket (Python's ssl)
    instead of gRPC, the receiver reading into one reused buffer."""
    extra = dict((k, int(v)) for k, v in (kv.split("=") for kv in variant.split(";")
                                          if "=" in kv))  # noqa: C402
    extra.setdefault("grpc.max_send_message_length", 64 << 20)
    extra.setdefault("grpc.max_receive_message_length", 64 << 20)
    return [o for o in OPTIONS if o[0] not in extra] + list(extra.items())


async def _serve(port_file: Path, cert: bytes, key: bytes, variant: str) -> None:
    server = grpc.aio.server(options=_options(variant))

    async def push(request_iterator, context):
        n = 0
        async for raw in request_iterator:
            n += len(raw)
        return str(n).encode()

    async def pull(request, context):
        size, count = (int(x) for x in request.split(b","))
        raw = frames.data_lead(size) + os.urandom(size)
        for _ in range(count):
            yield raw

    async def cpu(request, context):
        return repr(time.process_time()).encode()

    handlers = {
        "Push": grpc.stream_unary_rpc_method_handler(push),
        "Pull": grpc.unary_stream_rpc_method_handler(pull),
        "Cpu": grpc.unary_unary_rpc_method_handler(cpu),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Hop",
                                                                          handlers),))
    if variant.startswith("insecure"):  # for the share of TLS only: atoll's links are TLS
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    extra = ""
    if variant == TLS_SOCKET:
        extra = f",{_socket_server(cert, key)}"
    port_file.write_text(f"{port}{extra}")
    await server.wait_for_termination()


# -- what a plain TLS socket costs for the same bytes (no gRPC): the receiver reads into one
# reused buffer, as a model received straight into its final arrays would be -------------------
TLS_SOCKET = "tls-socket"
_HEAD = struct.Struct("<cQQ")  # direction, frame size, count


def _socket_server(cert: bytes, key: bytes) -> int:
    folder = Path(tempfile.mkdtemp())
    (folder / "c.pem").write_bytes(cert)
    (folder / "k.pem").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "c.pem", folder / "k.pem")
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_serve_socket, args=(context.wrap_socket(conn,
                             server_side=True),), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def _serve_socket(conn: ssl.SSLSocket) -> None:
    buffer = bytearray(64 << 20)
    while head := _recv_exact(conn, memoryview(bytearray(_HEAD.size))):
        direction, size, count = _HEAD.unpack(head)
        view = memoryview(buffer)[:size]
        for _ in range(count):
            if direction == b"u":
                _recv_exact(conn, view)
            else:
                conn.sendall(view)
        conn.sendall(b"k")


def _recv_exact(conn: ssl.SSLSocket, view: memoryview) -> memoryview | None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            return None
        got += n
    return view


class _SocketCalls:
    def __init__(self, port: int, cert: bytes):
        context = ssl.create_default_context(cadata=cert.decode())
        context.check_hostname = False
        self.conn = context.wrap_socket(socket.create_connection(("127.0.0.1", port)))
        self.buffer = bytearray(64 << 20)

    def push(self, raws) -> None:
        raws = list(raws)
        self.conn.sendall(_HEAD.pack(b"u", len(raws[0]), len(raws)))
        for raw in raws:
            self.conn.sendall(raw)
        _recv_exact(self.conn, memoryview(bytearray(1)))

    def pull(self, request: bytes):
        size, count = (int(x) for x in request.split(b","))
        self.conn.sendall(_HEAD.pack(b"d", size, count))
        view = memoryview(self.buffer)[:size]
        for _ in range(count):
            yield _recv_exact(self.conn, view)
        _recv_exact(self.conn, memoryview(bytearray(1)))


class Receiver:
    """The child process and a channel to it."""

    def __init__(self, folder: Path, variant: str, index: int):
        from atoll.pki.ephemeral import self_signed

        cert, key = self_signed("127.0.0.1")
        (folder / "cert.pem").write_bytes(cert)
        (folder / "key.pem").write_bytes(key)
        os.chmod(folder / "key.pem", 0o600)
        port_file = folder / f"port-{index}"
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.compare.grpc_hop", "--serve",
                                      str(folder), "--variant", variant, "--index", str(index)])
        while not port_file.exists() or not port_file.read_text():
            if self.proc.poll() is not None:
                raise SystemExit("the receiver did not start")
            time.sleep(0.05)
        target = f"127.0.0.1:{port_file.read_text().split(',')[0]}"
        if variant.startswith("insecure"):
            self.channel = grpc.insecure_channel(target, options=_options(variant))
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=cert)
            self.channel = grpc.secure_channel(target, creds, options=_options(variant))
        self.push = self.channel.stream_unary(SERVICE + "Push")
        self.pull = self.channel.unary_stream(SERVICE + "Pull")
        self.cpu = self.channel.unary_unary(SERVICE + "Cpu")
        if variant == TLS_SOCKET:
            calls = _SocketCalls(int(port_file.read_text().split(",")[1]), cert)
            self.push, self.pull = calls.push, calls.pull

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait()


def one(receiver: Receiver, nbytes: int, frame: int) -> dict[str, float]:
    """CPU seconds on each side for nbytes pushed, then nbytes pulled, in frames of `frame`."""
    count = nbytes // frame
    raw = frames.data_lead(frame) + os.urandom(frame)
    out = {}
    for direction in ("push", "pull"):
        theirs = float(receiver.cpu(b""))
        mine, wall = time.process_time(), time.perf_counter()
        if direction == "push":
            receiver.push(iter([raw] * count))
        else:
            for _ in receiver.pull(f"{frame},{count}".encode()):
                pass
        out[f"{direction}_wall"] = time.perf_counter() - wall
        out[f"{direction}_here"] = time.process_time() - mine
        out[f"{direction}_there"] = float(receiver.cpu(b"")) - theirs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--frames", default="1,4", help="frame sizes in MiB, comma-separated")
    parser.add_argument("--variants", default="base",
                        help='gRPC option sets, comma-separated: "base" or "key=int;key=int"')
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="base", help=argparse.SUPPRESS)
    parser.add_argument("--index", default="0", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from atoll.base.malloc_tuning import tune_for_streaming

    tune_for_streaming()  # as every parent does
    if args.serve:
        folder = Path(args.serve)
        asyncio.run(_serve(folder / f"port-{args.index}", (folder / "cert.pem").read_bytes(),
                           (folder / "key.pem").read_bytes(), args.variant))
        return
    nbytes = int(args.gib * 2**30)
    sizes = [int(float(x) * 2**20) for x in args.frames.split(",")]
    windows = args.variants.split(",")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        receivers = {w: Receiver(Path(tmp), w, i) for i, w in enumerate(windows)}
        try:
            for w in windows:  # warm up: TLS sessions, the receivers' heaps
                one(receivers[w], 64 << 20, sizes[0])
            for r in range(args.repeats):
                for w in windows:
                    for size in sizes if r % 2 == 0 else sizes[::-1]:
                        results.setdefault((w, size), []).append(one(receivers[w], nbytes, size))
        finally:
            for receiver in receivers.values():
                receiver.close()
    gib = nbytes / 2**30
    print(f"{args.gib:g} GiB each way over gRPC/TLS on 127.0.0.1, median of {args.repeats} "
          f"(load average {os.getloadavg()[0]:.1f}); CPU-s per GiB:\n")
    print("| gRPC options | frame | push: sender | push: receiver (aio) | pull: receiver | "
          "pull: sender (aio) | wall push + pull |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (w, size), runs in results.items():
        def med(key: str, runs=runs) -> float:
            values = sorted(run[key] for run in runs)
            return values[len(values) // 2] / gib
        print(f"| {w} | {size / 2**20:g} MiB | {med('push_here'):.2f} | "
              f"{med('push_there'):.2f} | {med('pull_here'):.2f} | {med('pull_there'):.2f} | "
              f"{(med('push_wall') + med('pull_wall')) * gib:.2f} s |")


if __name__ == "__main__":
    main()
