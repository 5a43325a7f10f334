"""kit.json: provision's cache of kit.yaml, which lets load_kit skip PyYAML until kit.yaml is
edited; a missing, corrupt or stale one is ignored."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atoll.pki.kit import KitError, load_kit, load_kit_without_yaml
from atoll.pki.project import Project
from atoll.pki.provision import ProvisionResult, add_site, add_user, provision

# load_kit in a process where `import yaml` fails: the kits' values, as JSON, on stdout.
WITHOUT_YAML = r"""
import json, sys
sys.modules["yaml"] = None  # any import of PyYAML now raises ImportError
from atoll.pki.kit import load_kit, load_kit_without_yaml
kits = [load_kit(path) for path in sys.argv[1:]]
assert [load_kit_without_yaml(path) for path in sys.argv[1:]] == kits
print(json.dumps([{k: str(v) for k, v in vars(kit).items()} for kit in kits]))
"""


def assert_cache_matches(startup: Path) -> None:
    """startup/kit.json is kit.yaml's document, keyed by kit.yaml's bytes, with its mode."""
    kit_yaml, kit_json = startup / "kit.yaml", startup / "kit.json"
    cache = json.loads(kit_json.read_text())
    assert cache == {
        "kit_yaml": kit_yaml.read_text(),
        "doc": yaml.safe_load(kit_yaml.read_text()),
    }
    assert stat.S_IMODE(kit_json.stat().st_mode) == stat.S_IMODE(kit_yaml.stat().st_mode)


@pytest.fixture
def site_kit(provisioned: ProvisionResult, tmp_path: Path) -> Path:
    """A private copy of hospital-a's kit, free to break."""
    return Path(shutil.copytree(provisioned.project_dir / "hospital-a", tmp_path / "hospital-a"))


def test_provision_writes_a_kit_json_for_every_kit(provisioned: ProvisionResult) -> None:
    assert len(provisioned.kits) == 6
    for kit in provisioned.kits:
        assert_cache_matches(kit.path / "startup")
    server = json.loads((provisioned.project_dir / "server" / "startup" / "kit.json").read_text())
    assert server["doc"]["listen"] == {"host": "0.0.0.0", "port": 8443}


def test_add_site_and_add_user_write_a_kit_json(tmp_path: Path, example_project: Project) -> None:
    root = provision(example_project, tmp_path).project_dir
    site = add_site(root, "clinic-c", "Clinic C")
    user = add_user(root, "bob@clinic.org", "Clinic C", "member")
    for kit in (site, user):
        assert_cache_matches(kit.path / "startup")
    assert json.loads((user.path / "startup" / "kit.json").read_text())["doc"]["role"] == "member"


def test_provisioned_kits_load_without_pyyaml(provisioned: ProvisionResult) -> None:
    root = provisioned.project_dir
    paths = [root / "server", root / "hospital-a", root / "lead@hospital-a.org" / "startup"]
    out = subprocess.run([sys.executable, "-c", WITHOUT_YAML, *map(str, paths)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    server, site, admin = json.loads(out.stdout)
    assert (server["kind"], server["listen_host"], server["listen_port"]) == (
        "server", "0.0.0.0", "8443")
    assert (site["name"], site["org"], site["server_host"], site["server_port"]) == (
        "hospital-a", "hospital-a", "fl.example.org", "8443")
    assert site["workspace"] == str(root / "hospital-a" / "workspace")
    assert (admin["kind"], admin["role"], admin["kit_dir"]) == (
        "admin", "lead", str(root / "lead@hospital-a.org"))


def test_an_edited_kit_yaml_wins_over_the_stale_kit_json(site_kit: Path) -> None:
    path = site_kit / "startup" / "kit.yaml"
    text = path.read_text()
    assert "port: 8443" in text
    path.write_text(text.replace("port: 8443", "port: 9443"))  # by hand, as an operator would
    assert json.loads((site_kit / "startup" / "kit.json").read_text())["doc"]["server"] == {
        "host": "fl.example.org", "port": 8443}
    assert load_kit_without_yaml(site_kit) is None
    assert load_kit(site_kit).server_port == 9443


def test_a_kit_without_kit_json_still_loads(site_kit: Path) -> None:
    expected = load_kit_without_yaml(site_kit)
    assert expected is not None
    (site_kit / "startup" / "kit.json").unlink()  # as provisioned by an older atoll
    assert load_kit_without_yaml(site_kit) is None
    assert load_kit(site_kit) == expected  # the YAML's document is the cached one


def _right_text(site_kit: Path) -> str:
    """kit.yaml's text as it stands inside a JSON string."""
    return json.dumps((site_kit / "startup" / "kit.yaml").read_text())[1:-1]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "\udcff",  # not UTF-8
        "[]",
        "[" * 100_000,  # deeper than the JSON parser recurses
        '{"kit_yaml": 1}',
        '{"kit_yaml": "RIGHT", "doc": ["a", "list"]}',
        '{"kit_yaml": "RIGHT"}',
        # another kit.yaml's: its port must not win
        '{"kit_yaml": "another", "doc": {"project": "p", "name": "n",'
        ' "kind": "site", "org": "o", "server": {"host": "h", "port": 1}}}',
    ],
)
def test_a_corrupt_or_foreign_kit_json_is_ignored(site_kit: Path, content: str) -> None:
    expected = load_kit(site_kit)
    cache = site_kit / "startup" / "kit.json"
    data = content.replace("RIGHT", _right_text(site_kit)).encode("utf-8", "surrogateescape")
    cache.write_bytes(data)
    assert load_kit_without_yaml(site_kit) is None
    assert load_kit(site_kit) == expected
    assert expected.server_port == 8443


def test_an_unreadable_kit_json_is_ignored(site_kit: Path) -> None:
    expected = load_kit(site_kit)
    cache = site_kit / "startup" / "kit.json"
    cache.unlink()
    cache.mkdir()  # read_bytes raises IsADirectoryError
    assert load_kit(site_kit) == expected


def test_the_checks_run_on_the_cached_document_too(site_kit: Path) -> None:
    (site_kit / "startup" / "client.crt").unlink()
    with pytest.raises(KitError, match="incomplete startup kit: missing") as info:
        load_kit_without_yaml(site_kit)
    assert "client.crt" in str(info.value)
