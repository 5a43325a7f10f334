"""Revocation on disk: `atoll provision revoke` writes a CA-signed CRL whose number only grows;
a parent keeps the newest list it verified and never goes back to an older one."""

from __future__ import annotations

import datetime as dt
import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from atoll.cli.provision import provision_group
from atoll.pki.ca import create_ca, load_ca
from atoll.pki.certs import issue_cert
from atoll.pki.crl import Entry, build_crl
from atoll.pki.project import Project
from atoll.pki.provision import ProvisionError, add_user, provision
from atoll.pki.revocation import CRLError, RevocationStore, cert_serial, verify
from atoll.pki.revoke import revoke

LEAD = "lead@hospital-a.org"


@pytest.fixture
def project(tmp_path: Path, example_project: Project) -> Path:
    return provision(example_project, tmp_path / "admin").project_dir


def state(project: Path) -> dict:
    return json.loads((project / "ca" / "state.json").read_text())


def pem(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize("serial", [1, 127, 128, 255, 256, 2**64, 2**159 - 1, None])
def test_cert_serial_reads_what_cryptography_reads(serial: int | None) -> None:
    ca = create_ca("p")
    issued = issue_cert(ca, "site-a", "o", "site")
    cert = issued.cert
    if serial is not None:  # re-sign with this serial: short and long INTEGER encodings
        from cryptography.hazmat.primitives import hashes
        cert = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
                .public_key(cert.public_key()).serial_number(serial)
                .not_valid_before(cert.not_valid_before_utc)
                .not_valid_after(cert.not_valid_after_utc).sign(ca.key, hashes.SHA256()))
    text = cert.public_bytes(Encoding.PEM)
    assert cert_serial(text) == cert.serial_number
    assert cert_serial(text.decode()) == cert.serial_number


@pytest.mark.parametrize("text", [b"", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----",
                                  b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"])
def test_cert_serial_refuses_what_is_not_a_certificate(text: bytes) -> None:
    with pytest.raises(ValueError, match="not a PEM certificate"):
        cert_serial(text)


def test_revoke_writes_a_growing_ca_signed_list_and_marks_the_state(project: Path) -> None:
    lead_serial = state(project)["participants"][LEAD]["serial"]
    first = revoke(project, LEAD, "affiliation-changed")
    assert (first.number, first.revoked, first.serial) == (1, 1, lead_serial)
    held = verify(pem(first.crl), project / "ca" / "rootCA.pem")
    assert held.number == 1 and set(held.entries) == {int(lead_serial, 16)}
    assert held.entries[int(lead_serial, 16)].reason == "affiliation-changed"
    assert state(project)["participants"][LEAD]["revoked"]["crl_number"] == 1

    second = revoke(project, "hospital-b", "key-compromise")
    assert (second.number, second.revoked) == (2, 2)
    crl = x509.load_pem_x509_crl(second.crl.read_bytes())
    assert crl.is_signature_valid(load_ca(project / "ca").cert.public_key())
    assert {r.serial_number for r in crl} == {int(lead_serial, 16),
                                              int(second.serial, 16)}
    kit_cert = (project / LEAD / "startup" / "client.crt").read_bytes()
    assert verify(pem(second.crl), project / "ca" / "rootCA.pem").of(kit_cert) is not None


@pytest.mark.parametrize(("name", "reason", "message"), [
    ("nobody@x.org", "unspecified", "is not a participant of project pathology-consortium"),
    ("server", "unspecified", "the server's certificate cannot be revoked"),
    (LEAD, "because", "is not a revocation reason"),
])
def test_revoke_refuses_with_what_to_do(project: Path, name: str, reason: str,
                                        message: str) -> None:
    with pytest.raises(ProvisionError, match=message):
        revoke(project, name, reason)
    assert not (project / "ca" / "crl.pem").exists()


def test_a_revoked_name_is_refused_twice_and_may_be_issued_again(project: Path) -> None:
    revoke(project, LEAD)
    with pytest.raises(ProvisionError, match="already revoked"):
        revoke(project, LEAD.upper())
    old = state(project)["participants"][LEAD]
    (project / LEAD).rename(project / "departed")  # the old kit folder is out of the way
    add_user(project, LEAD, "hospital-a", "member")
    entry = state(project)["participants"][LEAD]
    assert entry["role"] == "member" and entry["serial"] != old["serial"]
    assert [p["serial"] for p in entry["previous"]] == [old["serial"]]
    assert revoke(project, LEAD).number == 2


def test_a_parent_keeps_the_newest_verified_list(project: Path, tmp_path: Path) -> None:
    ca_file = project / "ca" / "rootCA.pem"
    one = pem(revoke(project, LEAD).crl)
    two = pem(revoke(project, "hospital-b").crl)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    store = RevocationStore(workspace, ca_file)
    assert store.install(two)[0] is True
    assert stat.S_IMODE((workspace / "crl.pem").stat().st_mode) == 0o600
    assert store.install(two) == (False, store.current)  # the same list again: nothing to do
    with pytest.raises(CRLError, match="number 1, older than the number 2"):
        store.install(one)
    ca = load_ca(project / "ca")
    other = build_crl(ca, [Entry(7, dt.datetime.now(dt.UTC), "unspecified")], 2).decode()
    with pytest.raises(CRLError, match="number 2 of the one already held but other entries"):
        store.install(other)
    assert RevocationStore(workspace, ca_file).load().number == 2  # read back at start


def test_a_list_of_another_ca_or_altered_is_refused(project: Path, tmp_path: Path) -> None:
    ca_file = project / "ca" / "rootCA.pem"
    stranger = create_ca("pathology-consortium")  # same name, another key
    forged = build_crl(stranger, [Entry(1, dt.datetime.now(dt.UTC), "unspecified")], 9)
    with pytest.raises(CRLError, match="does not verify with this project's root CA"):
        verify(forged.decode(), ca_file)
    with pytest.raises(CRLError, match="not a PEM certificate revocation list"):
        verify("garbage", ca_file)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "crl.pem").write_bytes(forged)
    with pytest.raises(CRLError, match="remove this file and push"):
        RevocationStore(workspace, ca_file).load()


def test_revoke_on_the_command_line(project: Path) -> None:
    result = CliRunner().invoke(provision_group, ["revoke", str(project), "hospital-a",
                                                  "--reason", "cessation-of-operation"])
    assert result.exit_code == 0, result.output
    assert "Revoked the site hospital-a" in result.output
    assert "revocation list 1 (1 certificate revoked)" in result.output
    assert "atoll crl push" in result.output
    again = CliRunner().invoke(provision_group, ["revoke", str(project), "hospital-a"])
    assert again.exit_code == 2 and "already revoked" in again.output
