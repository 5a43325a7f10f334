"""`provision`, `add_site`, `add_user`: the project folder, its modes, its certificates."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from atoll.parent.local_config import record_kits
from atoll.parent.local_record import fingerprint, read_record
from atoll.pki import certs
from atoll.pki import provision as provision_module
from atoll.pki.identity import Identity, identity_from_cert
from atoll.pki.kit import load_kit
from atoll.pki.project import Project, ProjectError, parse_project
from atoll.pki.provision import ProvisionError, ProvisionResult, add_site, add_user, provision


def tree(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under root (folders end with '/')."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_dir():
            out[rel + "/"] = oct(path.stat().st_mode & 0o777)
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_layout(provisioned: ProvisionResult) -> None:
    root = provisioned.project_dir
    assert root.name == "pathology-consortium"
    files = {p for p in tree(root) if not p.endswith("/")}
    expected = {
        "ca/rootCA.pem", "ca/rootCA.key", "ca/state.json",
        "server/startup/server.crt", "server/startup/server.key", "server/startup/rootCA.pem",
        "server/startup/kit.yaml", "server/startup/kit.json", "server/startup/project.json",
        "server/local/site.yaml",
    }  # fmt: skip
    for site in ("hospital-a", "hospital-b", "university"):
        expected |= {f"{site}/startup/{f}" for f in ("client.crt", "client.key", "rootCA.pem")}
        expected |= {f"{site}/startup/{f}" for f in ("kit.yaml", "kit.json")}
        expected |= {f"{site}/local/site.yaml", f"{site}/local/authorization.json"}
        expected |= {f"{site}/local/study_runtime.yaml"}
    for user in ("admin@consortium.org", "lead@hospital-a.org"):
        expected |= {f"{user}/startup/{f}" for f in ("client.crt", "client.key", "rootCA.pem")}
        expected |= {f"{user}/startup/kit.yaml", f"{user}/startup/kit.json"}
    assert files == expected
    assert [(k.name, k.kind) for k in provisioned.kits] == [
        ("server", "server"),
        ("hospital-a", "site"),
        ("hospital-b", "site"),
        ("university", "site"),
        ("admin@consortium.org", "admin"),
        ("lead@hospital-a.org", "admin"),
    ]
    assert not list(root.parent.glob(".*")), "a temporary folder was left behind"


def test_each_parent_kit_records_that_its_local_files_pass(provisioned: ProvisionResult) -> None:
    """A parent started from a fresh kit skips the check of local/ (atoll.parent.local_record):
    `atoll provision` records it (record_kits) once pki has written the kits."""
    record_kits(provisioned.project_dir)
    for kit in provisioned.kits:
        if kit.kind == "admin":
            continue
        found = fingerprint(kit.path / "local", study_runtime=kit.kind == "site")
        assert found is not None
        values = read_record(kit.path / "workspace", found[0])
        assert values is not None, kit.name
        assert values["launcher"] == "process"
        assert read_record(kit.path / "workspace", "0" * 64) is None


def test_private_keys_are_0600_and_private_folders_0700(provisioned: ProvisionResult) -> None:
    root = provisioned.project_dir
    keys = list(root.rglob("*.key"))
    assert len(keys) == 7  # the CA's and six participants'
    for key in keys:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE((root / "ca" / "state.json").stat().st_mode) == 0o600
    for folder in [root, root / "ca", *root.glob("*/startup")]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_every_certificate_chains_to_the_ca_and_says_who_it_is(
    provisioned: ProvisionResult,
) -> None:
    root = provisioned.project_dir
    ca = load_cert(root / "ca" / "rootCA.pem")
    expected = {
        "server": Identity("server", "pathology-consortium", "server"),
        "hospital-a": Identity("hospital-a", "hospital-a", "site"),
        "university": Identity("university", "university", "site"),
        "admin@consortium.org": Identity("admin@consortium.org", "consortium", "admin", "project_admin"),
        "lead@hospital-a.org": Identity("lead@hospital-a.org", "hospital-a", "admin", "lead"),
    }  # fmt: skip
    for folder, identity in expected.items():
        name = "server.crt" if folder == "server" else "client.crt"
        cert = load_cert(root / folder / "startup" / name)
        cert.verify_directly_issued_by(ca)
        assert (root / folder / "startup" / "rootCA.pem").read_bytes() == (
            root / "ca" / "rootCA.pem"
        ).read_bytes()
        assert identity_from_cert(cert.public_bytes(_pem())) == identity
        eku = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        wanted = (
            ExtendedKeyUsageOID.SERVER_AUTH
            if folder == "server"
            else ExtendedKeyUsageOID.CLIENT_AUTH
        )
        assert eku == [wanted]
    server = load_cert(root / "server" / "startup" / "server.crt")
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.org", "localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]


def _pem():
    from cryptography.hazmat.primitives.serialization import Encoding

    return Encoding.PEM


def test_kits_load_and_point_at_their_files(provisioned: ProvisionResult) -> None:
    root = provisioned.project_dir
    server = load_kit(root / "server")
    assert (server.kind, server.name, server.org) == ("server", "server", "pathology-consortium")
    assert server.server_address == "fl.example.org:8443"
    assert server.listen_address == "0.0.0.0:8443"
    assert server.workspace == root / "server" / "workspace"
    assert server.cert == root / "server" / "startup" / "server.crt"
    site = load_kit(root / "hospital-b")
    assert (site.kind, site.org, site.role, site.listen_host) == ("site", "hospital-b", None, None)
    assert site.key == root / "hospital-b" / "startup" / "client.key"
    assert site.local_dir == root / "hospital-b" / "local"
    admin = load_kit(root / "lead@hospital-a.org")
    assert (admin.kind, admin.role, admin.project) == ("admin", "lead", "pathology-consortium")


def test_project_json_is_the_validated_project(
    provisioned: ProvisionResult, example_project: Project
) -> None:
    path = provisioned.project_dir / "server" / "startup" / "project.json"
    seeded = parse_project(json.loads(path.read_text()))
    assert seeded == example_project
    assert seeded.server.listen.host == "0.0.0.0"  # resolved, so the server need not guess


def test_local_templates_parse_and_map_the_sites_studies(provisioned: ProvisionResult) -> None:
    root = provisioned.project_dir
    for folder in ("server", "hospital-a"):
        assert yaml.safe_load((root / folder / "local" / "site.yaml").read_text()) == {
            "launcher": "process"
        }
    runtime = yaml.safe_load((root / "hospital-a" / "local" / "study_runtime.yaml").read_text())
    assert runtime["format_version"] == 2
    # a project with named studies has no `default` study (server/studies.py)
    assert list(runtime["studies"]) == ["pathology", "outcomes"]
    runtime = yaml.safe_load((root / "university" / "local" / "study_runtime.yaml").read_text())
    assert list(runtime["studies"]) == ["pathology"]
    text = (root / "university" / "local" / "study_runtime.yaml").read_text()
    assert "# secret_env:" in text and "mode: ro" in text


def test_state_records_every_participant(provisioned: ProvisionResult) -> None:
    state = json.loads((provisioned.ca_dir / "state.json").read_text())
    assert state["project"] == "pathology-consortium"
    assert state["server"] == {"name": "server", "host": "fl.example.org", "port": 8443}
    serials = {name: entry["serial"] for name, entry in state["participants"].items()}
    assert len(serials) == 6 and len(set(serials.values())) == 6
    cert = load_cert(provisioned.project_dir / "hospital-a" / "startup" / "client.crt")
    assert serials["hospital-a"] == format(cert.serial_number, "x")
    assert state["participants"]["lead@hospital-a.org"]["role"] == "lead"


def test_an_existing_project_folder_is_refused_unless_forced(
    tmp_path: Path, example_project: Project
) -> None:
    project = example_project
    first = provision(project, tmp_path)
    before = tree(first.project_dir)
    with pytest.raises(ProvisionError, match="already exists; pass --force"):
        provision(project, tmp_path)
    assert tree(first.project_dir) == before
    old_ca = (first.ca_dir / "rootCA.pem").read_bytes()
    second = provision(project, tmp_path, force=True)
    assert (second.ca_dir / "rootCA.pem").read_bytes() != old_ca
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pathology-consortium"]


def test_a_failure_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_project: Project
) -> None:
    calls = []

    def failing_issue(*args: Any, **kwargs: Any) -> certs.IssuedCert:
        calls.append(args[1])
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return certs.issue_cert(*args, **kwargs)

    monkeypatch.setattr(provision_module, "issue_cert", failing_issue)
    with pytest.raises(OSError, match="No space left"):
        provision(example_project, tmp_path)
    assert calls == ["server", "hospital-a", "hospital-b"]
    assert list(tmp_path.iterdir()) == []


def test_a_failed_forced_run_keeps_the_old_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_project: Project
) -> None:
    project = example_project
    before = tree(provision(project, tmp_path).project_dir)

    def failing_issue(*args: Any, **kwargs: Any) -> certs.IssuedCert:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(provision_module, "issue_cert", failing_issue)
    with pytest.raises(OSError):
        provision(project, tmp_path, force=True)
    assert tree(tmp_path / "pathology-consortium") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pathology-consortium"]


@pytest.fixture
def fresh(tmp_path: Path, example_project: Project) -> Path:
    return provision(example_project, tmp_path).project_dir


def test_add_site_writes_only_its_kit_and_the_state(fresh: Path) -> None:
    before = tree(fresh)
    kit = add_site(fresh, "clinic-c", "Clinic C")
    after = tree(fresh)
    changed = {p for p in before if before[p] != after.get(p)}
    assert changed == {"ca/state.json"}
    added = set(after) - set(before)
    assert added == {
        "clinic-c/", "clinic-c/startup/", "clinic-c/local/",
        "clinic-c/startup/client.crt", "clinic-c/startup/client.key",
        "clinic-c/startup/rootCA.pem", "clinic-c/startup/kit.yaml", "clinic-c/startup/kit.json",
        "clinic-c/local/site.yaml", "clinic-c/local/study_runtime.yaml",
        "clinic-c/local/authorization.json",
    }  # fmt: skip
    assert kit.path == fresh / "clinic-c"
    assert stat.S_IMODE((kit.path / "startup" / "client.key").stat().st_mode) == 0o600
    cert = load_cert(kit.path / "startup" / "client.crt")
    cert.verify_directly_issued_by(load_cert(fresh / "ca" / "rootCA.pem"))
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "Clinic C"
    loaded = load_kit(kit.path)
    assert (loaded.name, loaded.kind, loaded.server_address) == (
        "clinic-c", "site", "fl.example.org:8443",
    )  # fmt: skip
    runtime = yaml.safe_load((kit.path / "local" / "study_runtime.yaml").read_text())
    assert runtime == {"format_version": 2, "studies": {"default": {}}}
    state = json.loads((fresh / "ca" / "state.json").read_text())
    assert state["participants"]["clinic-c"]["serial"] == format(cert.serial_number, "x")
    assert len(state["participants"]) == 7


def test_add_user_writes_an_admin_kit(fresh: Path) -> None:
    before = tree(fresh)
    kit = add_user(fresh, "bob@clinic.org", "Clinic C", "member")
    after = tree(fresh)
    assert {p for p in before if before[p] != after.get(p)} == {"ca/state.json"}
    assert identity_from_cert((kit.path / "startup" / "client.crt").read_bytes()) == Identity(
        "bob@clinic.org", "Clinic C", "admin", "member"
    )
    assert not (kit.path / "local").exists()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("hospital-a", "'hospital-a' is already provisioned (the site 'hospital-a')"),
        ("Hospital-A", "not a valid site name"),
        ("server", "reserved"),
    ],
)
def test_add_site_refuses_bad_and_duplicate_names(fresh: Path, name: str, expected: str) -> None:
    before = tree(fresh)
    with pytest.raises(ProjectError) as info:
        add_site(fresh, name, "o")
    assert expected in str(info.value)
    assert tree(fresh) == before


def test_add_user_refuses_duplicates_case_insensitively_and_bad_fields(fresh: Path) -> None:
    before = tree(fresh)
    with pytest.raises(ProjectError) as info:
        add_user(fresh, "Lead@Hospital-A.org", "o", "lead")
    assert "already provisioned (the admin 'lead@hospital-a.org')" in str(info.value)
    with pytest.raises(ProjectError) as info:
        add_user(fresh, "nobody", " o", "boss")
    assert [i.path for i in info.value.issues] == ["name", "org", "role"]
    assert tree(fresh) == before


def test_add_site_outside_a_project_folder(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match="not a provisioned project folder"):
        add_site(tmp_path, "clinic-c", "o")
