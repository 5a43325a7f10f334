"""The server parent's largest TLS record (site.yaml's links.tls_record_bytes), seen on the wire.

Each connection keeps a buffer of that size for the records it sends, which is what makes the
setting worth having at 10,000 sites. A relay between a site and the server reads the length of
every TLS record the server sends while it answers with 256 KiB.
"""

from __future__ import annotations

import socket
import struct
import threading

import grpc
import pytest

from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from atoll.pki.tls import channel_credentials, server_credentials
from atoll.wire.aio_server import LoopServer

ANSWER = 256 * 1024


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    project = parse_project({
        "name": "records", "server": {"host": "localhost", "port": 8443},
        "sites": [{"name": "site-1", "org": "org-1"}],
        "users": [{"name": "lead@org-1.org", "org": "org-1", "role": "lead"}]})
    root = provision(project, tmp_path_factory.mktemp("records")).project_dir
    return load_kit(root / "server"), load_kit(root / "site-1")


class RecordRelay:
    """Relays one connection to `port`; notes the length of each TLS record coming back."""

    def __init__(self, port: int):
        self.port, self.lengths = port, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"localhost:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.port))
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        pending = b""
        try:
            while data := upstream.recv(65536):
                pending += data
                while len(pending) >= 5:  # type, version, length: then the record
                    (length,) = struct.unpack(">H", pending[3:5])
                    if len(pending) < 5 + length:
                        break
                    self.lengths.append(length)
                    pending = pending[5 + length:]
                client.sendall(data)
        except OSError:  # the client hung up first (the channel closed)
            pass
        finally:
            client.close()
            upstream.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # either end closed
            pass


def _records_of_an_answer(kits, tls_record_bytes: int | None) -> list[int]:
    server_kit, site_kit = kits
    server = LoopServer(2, tls_record_bytes=tls_record_bytes)
    answer = grpc.unary_unary_rpc_method_handler(lambda request, context: b"x" * ANSWER)
    handler = grpc.method_handlers_generic_handler("t.T", {"Get": answer})
    server.server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", server_credentials(server_kit))
    server.start()
    try:
        relay = RecordRelay(port)
        with grpc.secure_channel(relay.address, channel_credentials(site_kit)) as channel:
            assert len(channel.unary_unary("/t.T/Get")(b"", timeout=30)) == ANSWER
        return relay.lengths
    finally:
        server.stop(0)


def test_the_server_sends_records_no_larger_than_its_setting(kits):
    plain = _records_of_an_answer(kits, None)
    assert sum(1 for n in plain if n > 8192) >= 8  # gRPC's 16 KiB records: the relay reads them
    small = _records_of_an_answer(kits, 4096)
    assert max(small) <= 4096 + 256  # a record's plaintext, and its tag and padding
    assert sum(small) >= ANSWER  # the answer came through the relay
