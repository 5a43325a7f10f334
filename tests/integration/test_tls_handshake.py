"""Real mutual-TLS handshakes on 127.0.0.1 with provisioned kits.

Python's ``ssl`` module checks what the certificates themselves allow (chain, validity, key
usage, host names); two gRPC calls check the credentials helpers of ``atoll.pki.tls`` and that
the server reads the caller's identity from the verified certificate.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from atoll.pki.ca import create_ca, load_ca
from atoll.pki.certs import IssuedCert, issue_cert
from atoll.pki.identity import Identity, identity_from_cert
from atoll.pki.kit import Kit, load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from atoll.pki.tls import channel_credentials, server_credentials

IO_TIMEOUT = 10  # seconds: only so that a broken handshake cannot hang the suite


@dataclass
class Federation:
    root: Path
    server: Kit
    site: Kit
    admin: Kit
    spare: Path  # a folder for certificates made by the tests


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Federation:
    out = tmp_path_factory.mktemp("tls")
    project = parse_project(
        {
            "name": "tls-test",
            "server": {"host": "localhost", "port": 8443},
            "sites": [{"name": "site-1", "org": "org-1"}, {"name": "site-2", "org": "org-2"}],
            "users": [{"name": "lead@org-1.org", "org": "org-1", "role": "lead"}],
        }
    )
    root = provision(project, out).project_dir
    spare = out / "spare"
    spare.mkdir()
    return Federation(
        root, load_kit(root / "server"), load_kit(root / "site-1"),
        load_kit(root / "lead@org-1.org"), spare,
    )  # fmt: skip


def _files(fed: Federation, issued: IssuedCert, name: str) -> tuple[Path, Path]:
    cert, key = fed.spare / f"{name}.crt", fed.spare / f"{name}.key"
    issued.write(cert, key)
    return cert, key


@dataclass
class Outcome:
    server_error: BaseException | None = None
    client_error: BaseException | None = None
    peer: Identity | None = None
    reply: bytes = b""


def handshake(
    server_cert: tuple[Path, Path],
    server_ca: Path,
    client_cert: tuple[Path, Path] | None,
    client_ca: Path,
    server_hostname: str = "localhost",
) -> Outcome:
    """One connection: a TLS server requiring a client certificate, and one client."""
    outcome = Outcome()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*server_cert)
    server_ctx.load_verify_locations(server_ca)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server and its host name
    client_ctx.load_verify_locations(client_ca)
    if client_cert is not None:
        client_ctx.load_cert_chain(*client_cert)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            conn.settimeout(IO_TIMEOUT)
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    outcome.peer = identity_from_cert(tls.getpeercert(binary_form=True))
                    tls.sendall(outcome.peer.name.encode())
            except (ssl.SSLError, OSError) as exc:
                outcome.server_error = exc

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT) as raw:
                with client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
                    outcome.reply = tls.recv(100)
                    if not outcome.reply:
                        raise ConnectionError("the server closed the connection")
        except (ssl.SSLError, OSError) as exc:
            outcome.client_error = exc
        finally:
            if outcome.client_error is not None:
                listener.close()  # unblock accept() if the client never connected
            thread.join(IO_TIMEOUT)
    assert not thread.is_alive()
    return outcome


def _server(fed: Federation) -> tuple[Path, Path]:
    return fed.server.cert, fed.server.key


def _site(fed: Federation) -> tuple[Path, Path]:
    return fed.site.cert, fed.site.key


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1"])
def test_a_valid_site_certificate_is_accepted(federation: Federation, hostname: str) -> None:
    fed = federation
    outcome = handshake(_server(fed), fed.server.ca, _site(fed), fed.site.ca, hostname)
    assert outcome.server_error is None and outcome.client_error is None
    assert outcome.peer == Identity("site-1", "org-1", "site")
    assert outcome.reply == b"site-1"


def test_an_admin_certificate_is_accepted_with_its_role(federation: Federation) -> None:
    fed = federation
    outcome = handshake(_server(fed), fed.server.ca, (fed.admin.cert, fed.admin.key), fed.admin.ca)
    assert outcome.peer == Identity("lead@org-1.org", "org-1", "admin", "lead")


def test_a_certificate_from_another_ca_is_refused(federation: Federation) -> None:
    fed = federation
    impostor = _files(fed, issue_cert(create_ca("tls-test"), "site-1", "org-1", "site"), "other-ca")
    outcome = handshake(_server(fed), fed.server.ca, impostor, fed.site.ca)
    assert isinstance(outcome.server_error, ssl.SSLCertVerificationError)
    assert outcome.server_error.verify_message == "unable to get local issuer certificate"
    assert outcome.peer is None
    assert outcome.client_error is not None and outcome.reply == b""


def test_an_expired_certificate_is_refused(federation: Federation) -> None:
    fed = federation
    start = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    expired = issue_cert(
        load_ca(fed.root / "ca"), "site-1", "org-1", "site",
        not_before=start, not_after=start + dt.timedelta(days=365),
    )  # fmt: skip
    outcome = handshake(_server(fed), fed.server.ca, _files(fed, expired, "expired"), fed.site.ca)
    assert isinstance(outcome.server_error, ssl.SSLCertVerificationError)
    assert outcome.server_error.verify_message == "certificate has expired"
    assert outcome.peer is None
    assert outcome.client_error is not None and outcome.reply == b""


def test_a_client_without_a_certificate_is_refused(federation: Federation) -> None:
    fed = federation
    outcome = handshake(_server(fed), fed.server.ca, None, fed.site.ca)
    assert isinstance(outcome.server_error, ssl.SSLError)
    assert outcome.server_error.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    assert outcome.peer is None
    assert outcome.client_error is not None and outcome.reply == b""


def test_a_site_refuses_a_server_of_another_ca(federation: Federation) -> None:
    fed = federation
    fake = _files(
        fed, issue_cert(create_ca("x"), "server", "x", "server", hosts=("localhost",)), "fake"
    )
    outcome = handshake(fake, fed.server.ca, _site(fed), fed.site.ca)
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert outcome.client_error.verify_message == "unable to get local issuer certificate"


def test_a_site_certificate_cannot_act_as_the_server(federation: Federation) -> None:
    fed = federation
    outcome = handshake(_site(fed), fed.server.ca, _site(fed), fed.site.ca, "site-1")
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert "certificate purpose" in outcome.client_error.verify_message  # wording: OpenSSL


def test_the_server_certificate_is_only_valid_for_its_names(federation: Federation) -> None:
    fed = federation
    outcome = handshake(_server(fed), fed.server.ca, _site(fed), fed.site.ca, "elsewhere.org")
    assert isinstance(outcome.client_error, ssl.SSLCertVerificationError)
    assert "Hostname mismatch" in outcome.client_error.verify_message


def _who_am_i(request: bytes, context: grpc.ServicerContext) -> bytes:
    pem = context.auth_context()["x509_pem_cert"][0]
    identity = identity_from_cert(pem)
    return f"{identity.kind}:{identity.name}:{identity.org}:{identity.role}".encode()


@pytest.fixture(scope="module")
def grpc_port(federation: Federation):
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "atoll.test.Identity", {"WhoAmI": grpc.unary_unary_rpc_method_handler(_who_am_i)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", server_credentials(federation.server))
    server.start()
    yield port
    server.stop(grace=None)


def _call(port: int, credentials: grpc.ChannelCredentials) -> bytes:
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        return channel.unary_unary("/atoll.test.Identity/WhoAmI")(b"", timeout=IO_TIMEOUT)


def test_grpc_credentials_carry_the_identity(federation: Federation, grpc_port: int) -> None:
    assert _call(grpc_port, channel_credentials(federation.site)) == b"site:site-1:org-1:None"
    assert _call(grpc_port, channel_credentials(federation.admin)) == (
        b"admin:lead@org-1.org:org-1:lead"
    )


def test_grpc_refuses_a_certificate_from_another_ca(federation: Federation, grpc_port: int):
    cert, key = _files(
        federation, issue_cert(create_ca("tls-test"), "site-1", "org-1", "site"), "grpc-other"
    )
    credentials = grpc.ssl_channel_credentials(
        root_certificates=federation.site.ca.read_bytes(),
        private_key=key.read_bytes(),
        certificate_chain=cert.read_bytes(),
    )
    with pytest.raises(grpc.RpcError) as info:
        _call(grpc_port, credentials)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
