"""gRPC credentials from a startup kit: mutual TLS, anchored on the project's root CA only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from atoll.pki.kit import Kit, KitError

if TYPE_CHECKING:
    import grpc


def _read(kit: Kit) -> tuple[bytes, bytes, bytes]:
    try:
        return kit.cert.read_bytes(), kit.key.read_bytes(), kit.ca.read_bytes()
    except OSError as exc:
        raise KitError(f"cannot read the startup kit {kit.kit_dir}: {exc}") from None


def server_credentials(kit: Kit) -> grpc.ServerCredentials:
    """The server's credentials: every client must present a certificate of the project's CA."""
    import grpc

    if kit.kind != "server":
        raise KitError(f"{kit.kit_dir} is a {kit.kind} kit; the server needs the server kit")
    cert, key, ca = _read(kit)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(kit: Kit) -> grpc.ChannelCredentials:
    """A site's or admin's credentials: its own certificate, and the CA to check the server."""
    import grpc

    if kit.kind == "server":
        raise KitError(f"{kit.kit_dir} is the server kit; dial with a site or admin kit")
    cert, key, ca = _read(kit)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
