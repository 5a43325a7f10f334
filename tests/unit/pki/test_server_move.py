"""`atoll provision move-server`: a new server certificate from the same CA for the new name,
and the project's kits pointed at it (pki/server_move.py); the site's channel that follows an
edited kit (site/server_channel.py)."""

from __future__ import annotations

import copy
import ipaddress
import json
from pathlib import Path

import pytest
from cryptography import x509

from atoll.pki.kit import edit_kit_yaml, load_kit
from atoll.pki.project import ProjectError, default_listen_host, parse_project
from atoll.pki.provision import add_site, provision
from atoll.pki.server_move import move_server
from atoll.pki.state import read_state
from tests.unit.pki.conftest import EXAMPLE


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return provision(parse_project(copy.deepcopy(EXAMPLE)), tmp_path).project_dir


def _names(cert_path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in san}


def _verifies_under_ca(cert_path: Path, project: Path) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca = x509.load_pem_x509_certificate((project / "server" / "startup" / "rootCA.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    return True


def test_the_new_certificate_holds_the_new_name_under_the_same_ca(project):
    before = (project / "server" / "startup" / "server.crt").read_bytes()
    key_before = (project / "server" / "startup" / "server.key").read_bytes()
    moved = move_server(project, "fl.new-home.org", also=("fl.example.org",))
    cert = project / "server" / "startup" / "server.crt"
    assert cert.read_bytes() != before and cert.with_name("server.key").read_bytes() != key_before
    assert {"fl.new-home.org", "fl.example.org", "localhost"} <= _names(cert)
    assert _verifies_under_ca(cert, project)
    assert moved.new == ("fl.new-home.org", 8443) and moved.old == ("fl.example.org", 8443)
    # the CA's record: the server's new serial, the old kept in its history
    state = read_state(project)
    entry = state["participants"]["server"]
    assert entry["serial"] == moved.serial and entry["previous"]
    assert state["server"]["host"] == "fl.new-home.org"


def test_every_kit_in_the_project_folder_dials_the_new_address(project):
    moved = move_server(project, "fl.new-home.org", port=9443)
    for name in ("hospital-a", "hospital-b", "university", "admin@consortium.org"):
        kit = load_kit(project / name)
        assert (kit.server_host, kit.server_port) == ("fl.new-home.org", 9443), name
    assert {p.name for p in moved.kits_updated} >= {"hospital-a", "admin@consortium.org"}
    server = load_kit(project / "server")
    assert (server.server_host, server.server_port) == ("fl.new-home.org", 9443)
    assert (server.listen_host, server.listen_port) == ("0.0.0.0", 9443)
    doc = json.loads(server.project_json.read_text())
    assert doc["server"]["host"] == "fl.new-home.org" and doc["server"]["listen"]["port"] == 9443
    # a site added after the move is given the new address
    assert load_kit(add_site(project, "clinic", "clinic").path).server_host == "fl.new-home.org"


def test_a_kit_edited_by_hand_and_a_chosen_listen_address_stay_as_they_are(project):
    edit_kit_yaml(project / "hospital-b", server={"host": "proxy.hospital-b.org", "port": 443})
    edit_kit_yaml(project / "server", listen={"host": "10.0.0.5", "port": 8443})
    moved = move_server(project, "fl.new-home.org")
    assert load_kit(project / "hospital-b").server_host == "proxy.hospital-b.org"
    assert "hospital-b" not in {p.name for p in moved.kits_updated}
    assert load_kit(project / "server").listen_host == "10.0.0.5"
    # the server kit keeps its other settings (its workspace)
    assert load_kit(project / "server").workspace == project / "server" / "workspace"


def test_a_bad_name_is_refused_and_nothing_is_written(project):
    cert = project / "server" / "startup" / "server.crt"
    before, state = cert.read_bytes(), read_state(project)
    with pytest.raises(ProjectError) as refused:
        move_server(project, "0.0.0.0", port=70000, also=("not a name",))
    text = str(refused.value)
    assert "cannot be dialled" in text and "70000" in text and "not a name" in text
    assert cert.read_bytes() == before and read_state(project) == state


@pytest.mark.parametrize(("host", "listen"), [
    ("127.0.0.2", "127.0.0.2"), ("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1"),
    ("::1", "::1"), ("fl.example.org", "0.0.0.0"), ("10.1.2.3", "0.0.0.0"),
])
def test_the_default_listen_address_reaches_the_host_it_is_dialled_at(host, listen):
    assert default_listen_host(host) == listen
    assert ipaddress.ip_address(listen)


def test_a_moved_loopback_server_listens_on_its_new_address(tmp_path):
    doc = copy.deepcopy(EXAMPLE)
    doc["server"]["host"] = "127.0.0.1"
    project = provision(parse_project(doc), tmp_path).project_dir
    move_server(project, "127.0.0.2")
    assert load_kit(project / "server").listen_host == "127.0.0.2"


def test_the_site_channel_follows_an_edited_kit_and_keeps_a_broken_one_out(project):
    from atoll.site.server_channel import ServerChannel

    site = project / "hospital-a"
    server = ServerChannel(load_kit(site))
    try:
        assert server.follow() is False  # nothing edited
        assert server.redial() is None
        edit_kit_yaml(site, server={"host": "fl.new-home.org", "port": 9443})
        old_stub = server.stub
        channel, stub, address = server.redial()
        assert address == "fl.new-home.org:9443" == server.address
        assert stub is server.stub is not old_stub and channel is server.channel
        # the same address written again: no new channel
        edit_kit_yaml(site, server={"host": "fl.new-home.org", "port": 9443},
                      workspace="workspace")
        assert server.follow() is False
        # a half-saved edit is not followed: the current address is kept
        kit_yaml = site / "startup" / "kit.yaml"
        kit_yaml.write_text("server: {host: [\n")
        assert server.follow() is False and server.address == "fl.new-home.org:9443"
    finally:
        server.close()
