"""The process launcher's network: the render of each mode, and the two relays, for real."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from atoll.launchers.process import ProcessLauncher
from atoll.launchers.process_network import FORWARD_ENV, Relays, forward_inside
from atoll.spec.site_config import parse_site_config
from tests.unit.launchers.test_process_render import HOST, request_for

SOCKET = "/tmp/atoll-w-test/worker.sock"
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _site(process_block: str):
    config = parse_site_config({"launcher": "process", "process": json.loads(process_block)})
    return config, None


def _render(block: str, tmp_path: Path, **kw):
    site = _site(block)
    launcher = ProcessLauncher(site[0], parent_pid=1, share_cpus=False, sandbox_host=HOST)
    return launcher.render(request_for(site, meta=_meta(), parent_cert=CERT, **kw))


def _meta():
    from atoll.spec.meta import parse_meta

    return parse_meta(json.dumps({"name": "n", "deploy_map": {"app": ["@ALL"]}}).encode())


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_by_default_the_worker_gets_its_own_network_and_dials_the_bound_socket(tmp_path):
    rendered = _render("{}", tmp_path, parent_socket=SOCKET)
    argv = rendered["argv"]
    assert "--unshare-net" in argv and rendered["network"] == "isolated"
    assert (SOCKET, SOCKET) in _pairs(argv, "--bind")
    assert rendered["env"]["ATOLL_PARENT"] == f"unix:{SOCKET}"
    assert "ATOLL_PARENT_CERT" not in rendered["env"]  # no TLS on the socket
    assert FORWARD_ENV not in rendered["env"]


def test_network_host_is_the_opt_out_the_worker_dials_tcp(tmp_path):
    for block in ('{"network": "host"}', '{"sandbox": "none"}'):
        rendered = _render(block, tmp_path, parent_socket=SOCKET)
        assert "--unshare-net" not in rendered["argv"] and rendered["network"] == "host"
        assert rendered["env"]["ATOLL_PARENT"] == "127.0.0.1:7001"
        assert rendered["env"]["ATOLL_PARENT_CERT"] == CERT
        assert SOCKET not in rendered["argv"]


def test_allowed_destinations_are_relayed_sockets_bound_in_and_named_in_etc_hosts(tmp_path):
    site = _site('{"network": {"allow": ["127.0.0.1:5000", "mlflow.example.org:443"]}}')
    launcher = ProcessLauncher(site[0], parent_pid=1, share_cpus=False, sandbox_host=HOST)
    request = request_for(site, meta=_meta(), parent_socket=SOCKET)
    launcher._start_relays(request)  # what a launch does first
    try:
        folder = launcher._relays.folder
        rendered = launcher.render(request)
        argv = rendered["argv"]
        forward = json.loads(rendered["env"][FORWARD_ENV])
        assert forward == [["127.0.0.1", 5000, f"{folder}/dest-0.sock"],
                           ["127.0.100.1", 443, f"{folder}/dest-1.sock"]]
        binds = _pairs(argv, "--bind")
        assert {(p, p) for _, _, p in forward} <= set(binds)
        hosts = f"{folder}/hosts"
        assert (hosts, "/etc/hosts") in _pairs(argv, "--ro-bind")
        # over the host's /etc/hosts, which is bound first
        assert argv.index(hosts) > argv.index("/etc/hosts")
        assert "127.0.100.1 mlflow.example.org" in Path(hosts).read_text()
        assert rendered["network_allow"] == ["127.0.0.1:5000", "mlflow.example.org:443"]
        assert os.stat(folder).st_mode & 0o777 == 0o700
    finally:
        launcher.close()
    assert not os.path.exists(folder)


def test_a_launch_without_the_parents_socket_says_how_to_opt_out(tmp_path):
    from atoll.launchers.base import LaunchError

    site = _site("{}")
    launcher = ProcessLauncher(site[0], parent_pid=1, share_cpus=False, sandbox_host=HOST)
    with pytest.raises(LaunchError, match="process.network: host"):
        launcher._start_relays(request_for(site, meta=_meta()))


@contextlib.contextmanager
def _echo_server():
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_the_forwarder_and_the_relay_carry_a_connection_both_ways():
    """Worker side (forward_inside) on a loopback address, parent side (Relays) on a unix
    socket, the destination an echo server: what goes in comes back, whole, and ends."""
    with _echo_server() as port:
        relays = Relays([("127.0.0.1", port, "127.0.0.7")])
        try:
            forward_inside(relays.forward_spec())
            payload = os.urandom(300_000)
            with socket.create_connection(("127.0.0.7", port), timeout=10) as conn:
                conn.sendall(payload)
                conn.shutdown(socket.SHUT_WR)
                got = b""
                while chunk := conn.recv(65536):
                    got += chunk
            assert got == payload
        finally:
            relays.close()


def test_a_destination_that_is_down_closes_the_workers_connection():
    with socket.create_server(("127.0.0.1", 0)) as gone:
        port = gone.getsockname()[1]
    relays = Relays([("127.0.0.1", port, "127.0.0.8")])
    try:
        forward_inside(relays.forward_spec())
        with socket.create_connection(("127.0.0.8", port), timeout=10) as conn:
            conn.settimeout(10)
            assert conn.recv(10) == b""
    finally:
        relays.close()
