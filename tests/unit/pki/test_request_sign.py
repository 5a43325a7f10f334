"""The request/sign flow on disk: the participant's key is made in its own folder and stays
there; the project admin signs the request into a bundle with no key; the kit is assembled
around the key, and every mismatch is refused with what to do."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from atoll.cli.provision import provision_group
from atoll.pki.ca import create_ca
from atoll.pki.certs import subject_name
from atoll.pki.identity import Identity, identity_from_cert
from atoll.pki.kit import load_kit
from atoll.pki.project import Project, ProjectError
from atoll.pki.provision import ProvisionError, provision
from atoll.pki.request import assemble, make_request
from atoll.pki.revoke import revoke
from atoll.pki.sign_request import read_request, sign_request

USER = "newlead@clinic.org"


@pytest.fixture
def project(tmp_path: Path, example_project: Project) -> Path:
    return provision(example_project, tmp_path / "admin").project_dir


def flow(project: Path, home: Path, name: str, org: str, role: str | None = None):
    made = make_request(home, name, org, role)
    signed = sign_request(project, read_request(made.csr), csr_path=made.csr)
    return made, signed


def test_request_makes_a_private_key_and_a_request_only(tmp_path: Path) -> None:
    made = make_request(tmp_path / "me", USER, "clinic", "lead")
    assert made.folder == tmp_path / "me" / USER
    assert sorted(p.relative_to(made.folder).as_posix() for p in made.folder.rglob("*")) == [
        f"{USER}.csr", "startup", "startup/client.key"]
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    for folder in (made.folder, made.folder / "startup"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert b"PRIVATE KEY" not in made.csr.read_bytes()
    info = read_request(made.csr)
    assert (info.name, info.org, info.kind, info.role) == (USER, "clinic", "admin", "lead")
    with pytest.raises(ProvisionError, match="already exists; a request is made once per key"):
        make_request(tmp_path / "me", USER, "clinic", "lead")


def test_request_checks_the_fields_and_hints_at_role(tmp_path: Path) -> None:
    with pytest.raises(ProjectError) as info:
        make_request(tmp_path, USER, "clinic")  # no role: a site's request
    assert "a user's request needs --role" in str(info.value)
    with pytest.raises(ProjectError) as info:
        make_request(tmp_path, "server", " clinic")
    assert [i.path for i in info.value.issues] == ["name", "org"]
    assert list(tmp_path.iterdir()) == []


def test_signed_user_and_site_kits_load_and_hold_the_kept_key(project: Path,
                                                               tmp_path: Path) -> None:
    for name, role, kind in ((USER, "lead", "admin"), ("clinic-c", None, "site")):
        made, signed = flow(project, tmp_path / name, name, "clinic", role)
        key_before = made.key.read_bytes()
        bundle = json.loads(signed.bundle.read_text())
        assert "PRIVATE KEY" not in signed.bundle.read_text()
        assert bundle["server_host"] == "fl.example.org" and bundle["project"] == project.name
        done = assemble(signed.bundle, made.folder)
        assert done.ca_fingerprint == signed.ca_fingerprint
        kit = load_kit(made.folder)
        assert (kit.name, kit.kind, kit.org, kit.role) == (name, kind, "clinic", role)
        assert made.key.read_bytes() == key_before  # the key was never rewritten
        assert identity_from_cert(kit.cert.read_bytes()) == Identity(name, "clinic", kind, role)
        cert = x509.load_pem_x509_certificate(kit.cert.read_bytes())
        key = serialization.load_pem_private_key(key_before, None)
        assert cert.public_key() == key.public_key()
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(kit.ca.read_bytes()))
        assert (made.folder / "local").is_dir() == (kind == "site")
        entry = json.loads((project / "ca" / "state.json").read_text())["participants"][name]
        assert entry["source"] == "request" and entry["folder"] is None
        assert entry["serial"] == signed.serial == format(cert.serial_number, "x")
        assert not (project / name).exists()  # the admin's folder holds no kit of it


def test_sign_refuses_a_taken_name_until_it_is_revoked(project: Path, tmp_path: Path) -> None:
    made = make_request(tmp_path / "a", "lead@hospital-a.org", "hospital-a", "lead")
    with pytest.raises(ProjectError, match="already provisioned .* revoke it first"):
        sign_request(project, read_request(made.csr), csr_path=made.csr)
    revoke(project, "lead@hospital-a.org", "key-compromise")
    signed = sign_request(project, read_request(made.csr), csr_path=made.csr)
    entry = json.loads((project / "ca" / "state.json").read_text())["participants"][
        "lead@hospital-a.org"]
    assert entry["serial"] == signed.serial and len(entry["previous"]) == 1


def test_sign_refuses_requests_atoll_did_not_make(project: Path, tmp_path: Path) -> None:
    made = make_request(tmp_path, "clinic-c", "clinic")
    text = made.csr.read_bytes()
    altered = tmp_path / "altered.csr"  # another subject, the original signature
    csr = x509.load_pem_x509_csr(text)
    der = csr.public_bytes(serialization.Encoding.DER).replace(b"clinic-c", b"clinic-d")
    altered.write_bytes(x509.load_der_x509_csr(der).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ProvisionError, match="signature does not verify"):
        read_request(altered)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_csr = tmp_path / "rsa.csr"
    rsa_csr.write_bytes(x509.CertificateSigningRequestBuilder()
                        .subject_name(subject_name("clinic-r", "clinic", "site"))
                        .sign(rsa_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ProvisionError, match="not an ECDSA P-256 key"):
        read_request(rsa_csr)
    server_csr = tmp_path / "server.csr"
    key = serialization.load_pem_private_key(made.key.read_bytes(), None)
    server_csr.write_bytes(x509.CertificateSigningRequestBuilder()
                           .subject_name(subject_name("fl", "x", "server"))
                           .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ProvisionError, match="names no site or user"):
        read_request(server_csr)
    with pytest.raises(ProvisionError, match="cannot read the signing request"):
        read_request(made.key)  # the key, sent by mistake, is not a request


def test_assemble_refuses_another_requests_bundle_or_a_forged_one(project: Path,
                                                                   tmp_path: Path) -> None:
    mine = make_request(tmp_path / "me", "clinic-c", "clinic")
    _, theirs = flow(project, tmp_path / "them", "clinic-d", "clinic")
    with pytest.raises(ProvisionError, match="for another key"):
        assemble(theirs.bundle, mine.folder)
    signed = sign_request(project, read_request(mine.csr), csr_path=mine.csr)
    doc = json.loads(signed.bundle.read_text())
    doc["root_ca"] = create_ca(project.name).cert_pem().decode()  # a CA of the same name
    forged = tmp_path / "forged.signed.json"
    forged.write_text(json.dumps(doc))
    with pytest.raises(ProvisionError, match="not signed by the bundle's root CA"):
        assemble(forged, mine.folder)
    with pytest.raises(ProvisionError, match="cannot read the signed bundle"):
        assemble(mine.csr, mine.folder)
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    with pytest.raises(ProvisionError, match="not a signed bundle of `atoll provision sign`"):
        assemble(tmp_path / "other.json", mine.folder)
    with pytest.raises(ProvisionError, match="cannot read the key"):
        assemble(signed.bundle, tmp_path)
    assert not (mine.folder / "startup" / "kit.yaml").exists()


def test_the_flow_on_the_command_line(project: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    home = tmp_path / "home"
    made = runner.invoke(provision_group, ["request", "--name", USER, "--org", "clinic",
                                           "--role", "member", "--out", str(home)])
    assert made.exit_code == 0, made.output
    assert f"{USER}.csr   send this file to the project admin" in made.output
    csr = home / USER / f"{USER}.csr"
    declined = runner.invoke(provision_group, ["sign", str(project), str(csr)], input="n\n")
    assert declined.exit_code == 1
    assert f"asks for the certificate of the user {USER} (org clinic, role member)" in \
        declined.output
    assert not (home / USER / f"{USER}.signed.json").exists()
    signed = runner.invoke(provision_group, ["sign", str(project), str(csr)], input="y\n")
    assert signed.exit_code == 0, signed.output
    bundle = home / USER / f"{USER}.signed.json"
    assert f"Send {bundle} back" in signed.output
    again = runner.invoke(provision_group, ["sign", str(project), str(csr), "--yes"])
    assert again.exit_code == 2 and "already provisioned" in again.output
    built = runner.invoke(provision_group, ["assemble", str(bundle), "--kit", str(home / USER)])
    assert built.exit_code == 0, built.output
    assert f"atoll login --kit {home / USER}" in built.output
    assert load_kit(home / USER).role == "member"
