"""The CA, participant certificates and the identity the server reads back from them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from atoll.pki.ca import CAError, create_ca, load_ca, save_ca
from atoll.pki.certs import issue_cert
from atoll.pki.identity import Identity, IdentityError, identity_from_cert

UTC = dt.UTC


@pytest.fixture(scope="module")
def ca():
    return create_ca("proj")


def test_the_ca_is_a_p256_root_allowed_to_sign_only_leaves(ca) -> None:
    cert = ca.cert
    assert isinstance(ca.key.curve, ec.SECP256R1)
    assert cert.issuer == cert.subject
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "proj root CA"
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    cert.verify_directly_issued_by(cert)
    years = (cert.not_valid_after_utc - cert.not_valid_before_utc).days / 365
    assert 9.9 < years < 10.1


def test_save_and_load_the_ca(ca, tmp_path: Path) -> None:
    cert_path, key_path = save_ca(ca, tmp_path / "ca")
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert cert_path.stat().st_mode & 0o777 == 0o644
    loaded = load_ca(tmp_path / "ca")
    assert loaded.cert == ca.cert
    assert loaded.key.private_numbers() == ca.key.private_numbers()


def test_load_ca_names_the_broken_file(ca, tmp_path: Path) -> None:
    with pytest.raises(CAError, match="rootCA.pem"):
        load_ca(tmp_path)
    save_ca(ca, tmp_path)
    (tmp_path / "rootCA.key").write_bytes(create_ca("other").key_pem())
    with pytest.raises(CAError, match="rootCA.key is not the key of"):
        load_ca(tmp_path)
    (tmp_path / "rootCA.key").write_text("garbage")
    with pytest.raises(CAError, match="cannot read the CA key"):
        load_ca(tmp_path)


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_server_certificate(ca) -> None:
    issued = issue_cert(ca, "server", "proj", "server", hosts=("fl.example.org",))
    cert = issued.cert
    cert.verify_directly_issued_by(ca.cert)
    assert cert.subject.rfc4514_string() == "OU=server,O=proj,CN=server"
    assert _eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.org", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_server_host_given_as_an_ip_is_an_ip_san(ca) -> None:
    cert = issue_cert(ca, "server", "proj", "server", hosts=("10.1.2.3", "127.0.0.1")).cert
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.1.2.3"),
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]


def test_site_and_admin_certificates_are_client_only(ca) -> None:
    site = issue_cert(ca, "hospital-a", "Hospital A", "site").cert
    admin = issue_cert(ca, "lead@a.org", "Hospital A", "admin", "lead").cert
    for cert in (site, admin):
        cert.verify_directly_issued_by(ca.cert)
        assert _eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        with pytest.raises(x509.ExtensionNotFound):
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert site.subject.rfc4514_string() == "OU=site,O=Hospital A,CN=hospital-a"
    assert admin.subject.get_attributes_for_oid(NameOID.TITLE)[0].value == "lead"


def test_a_role_is_required_for_admins_and_only_for_them(ca) -> None:
    with pytest.raises(ValueError, match="role is required"):
        issue_cert(ca, "a@b.org", "o", "admin")
    with pytest.raises(ValueError, match="role is required"):
        issue_cert(ca, "site-a", "o", "site", "lead")
    with pytest.raises(ValueError, match="kind must be one of"):
        issue_cert(ca, "x", "o", "robot")  # type: ignore[arg-type]


def test_validity_is_configurable_and_capped_by_the_ca(ca) -> None:
    start = dt.datetime(2020, 1, 1, tzinfo=UTC)
    expired = issue_cert(
        ca, "old", "o", "site", not_before=start, not_after=start.replace(year=2021)
    )
    assert expired.cert.not_valid_after_utc == dt.datetime(2021, 1, 1, tzinfo=UTC)
    short_ca = create_ca("p", not_after=dt.datetime.now(UTC) + dt.timedelta(days=30))
    cert = issue_cert(short_ca, "s", "o", "site").cert
    assert cert.not_valid_after_utc == short_ca.cert.not_valid_after_utc


def test_the_key_is_unencrypted_pkcs8_pem(ca) -> None:
    issued = issue_cert(ca, "s", "o", "site")
    pem = issued.key_pem()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    key = serialization.load_pem_private_key(pem, password=None)
    assert key.public_key() == issued.cert.public_key()


def test_write_sets_modes(ca, tmp_path: Path) -> None:
    issued = issue_cert(ca, "s", "o", "site")
    issued.write(tmp_path / "c.crt", tmp_path / "c.key")
    assert (tmp_path / "c.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "c.crt").stat().st_mode & 0o777 == 0o644
    assert x509.load_pem_x509_certificate((tmp_path / "c.crt").read_bytes()) == issued.cert


def test_identity_from_pem_der_and_str(ca) -> None:
    admin = issue_cert(ca, "lead@a.org", "Hospital A", "admin", "org_admin")
    expected = Identity(name="lead@a.org", org="Hospital A", kind="admin", role="org_admin")
    pem = admin.cert_pem()
    assert identity_from_cert(pem) == expected
    assert identity_from_cert(pem.decode()) == expected
    assert identity_from_cert(admin.cert.public_bytes(serialization.Encoding.DER)) == expected
    site = issue_cert(ca, "hospital-a", "Hospital A", "site")
    assert identity_from_cert(site.cert_pem()) == Identity("hospital-a", "Hospital A", "site")


def _foreign(ca, attributes: list[x509.NameAttribute]) -> bytes:
    """A certificate with a hand-made subject, as another tool might issue it."""
    from cryptography.hazmat.primitives import hashes

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(ca.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ([(NameOID.COMMON_NAME, "x"), (NameOID.ORGANIZATION_NAME, "o")], "no kind (OU)"),
        (
            [(NameOID.COMMON_NAME, "x"), (NameOID.ORGANIZATIONAL_UNIT_NAME, "site")],
            "no organization",
        ),
        (
            [(NameOID.ORGANIZATION_NAME, "o"), (NameOID.ORGANIZATIONAL_UNIT_NAME, "site")],
            "no common name",
        ),
        (
            [
                (NameOID.COMMON_NAME, "x"),
                (NameOID.ORGANIZATION_NAME, "o"),
                (NameOID.ORGANIZATIONAL_UNIT_NAME, "robot"),
            ],
            "'robot' is not one of",
        ),
        (
            [
                (NameOID.COMMON_NAME, "x"),
                (NameOID.ORGANIZATION_NAME, "o"),
                (NameOID.ORGANIZATIONAL_UNIT_NAME, "admin"),
            ],
            "role None is not one of",
        ),
        (
            [
                (NameOID.COMMON_NAME, "x"),
                (NameOID.ORGANIZATION_NAME, "o"),
                (NameOID.ORGANIZATIONAL_UNIT_NAME, "site"),
                (NameOID.TITLE, "lead"),
            ],
            "a site certificate carries no role",
        ),
        (
            [
                (NameOID.COMMON_NAME, "x"),
                (NameOID.COMMON_NAME, "y"),
                (NameOID.ORGANIZATION_NAME, "o"),
                (NameOID.ORGANIZATIONAL_UNIT_NAME, "site"),
            ],
            "2 common name (CN) fields",
        ),
    ],
)
def test_identity_refuses_certificates_atoll_did_not_issue(ca, attributes, expected) -> None:
    pem = _foreign(ca, [x509.NameAttribute(oid, value) for oid, value in attributes])
    with pytest.raises(IdentityError, match=re.escape(expected)):
        identity_from_cert(pem)


def test_identity_refuses_garbage() -> None:
    with pytest.raises(IdentityError, match="not a certificate"):
        identity_from_cert(b"not a certificate at all")


def test_identity_from_the_subject_grpc_reports_matches_the_certificate(ca) -> None:
    from atoll.pki.identity import identity_from_subject

    cases = [issue_cert(ca, "lead@a.org", "org-a", "admin", "lead"),
             issue_cert(ca, "site-1", "Hospital, Inc.", "site")]
    # What gRPC puts in auth_context()["x509_subject"] (seen on grpcio 1.85), per case.
    subjects = ["title=lead,OU=admin,O=org-a,CN=lead@a.org",
                r"OU=site,O=Hospital\, Inc.,CN=site-1"]
    for issued, subject in zip(cases, subjects, strict=True):
        assert identity_from_subject(subject) == identity_from_cert(issued.cert_pem())
    assert identity_from_subject(r"OU=site,O=Hospital\, Inc.,CN=site-1").org == "Hospital, Inc."
    with pytest.raises(IdentityError, match="no kind"):
        identity_from_subject("O=x,CN=y")
    with pytest.raises(IdentityError, match="2 common name"):
        identity_from_subject("OU=site,O=x,CN=y,CN=z")
    with pytest.raises(IdentityError, match="carries no role"):
        identity_from_subject("title=lead,OU=site,O=x,CN=y")
