"""load_kit: the paths a parent needs, and errors that say what is wrong with a kit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from atoll.pki.kit import Kit, KitError, load_kit, render_kit_yaml
from atoll.pki.provision import ProvisionResult


@pytest.fixture
def site_kit(provisioned: ProvisionResult, tmp_path: Path) -> Path:
    """A private copy of hospital-a's kit, free to break."""
    return Path(shutil.copytree(provisioned.project_dir / "hospital-a", tmp_path / "hospital-a"))


def test_the_kit_folder_its_startup_folder_or_its_kit_yaml(site_kit: Path) -> None:
    expected = load_kit(site_kit)
    assert load_kit(site_kit / "startup") == expected
    assert load_kit(site_kit / "startup" / "kit.yaml") == expected
    assert expected.kit_dir == site_kit and expected.kit_dir.is_absolute()
    assert expected.ca == site_kit / "startup" / "rootCA.pem"
    assert expected.workspace == site_kit / "workspace"


def test_a_relative_path_is_made_absolute(site_kit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(site_kit.parent)
    kit = load_kit("hospital-a")
    assert kit.kit_dir == site_kit and kit.cert.is_absolute()


def test_a_folder_without_a_kit(tmp_path: Path) -> None:
    with pytest.raises(KitError) as info:
        load_kit(tmp_path)
    message = str(info.value)
    assert message.startswith(f"not a startup kit: {tmp_path}/startup/kit.yaml missing")
    assert "run `atoll provision PROJECT.yaml --out DIR`" in message
    with pytest.raises(KitError, match="does not exist"):
        load_kit(tmp_path / "nowhere")


def test_a_missing_certificate_or_key(site_kit: Path) -> None:
    (site_kit / "startup" / "client.key").unlink()
    (site_kit / "startup" / "rootCA.pem").unlink()
    with pytest.raises(KitError) as info:
        load_kit(site_kit)
    assert "incomplete startup kit: missing" in str(info.value)
    assert "client.key" in str(info.value) and "rootCA.pem" in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{unclosed", "cannot read"),
        ("- a list", "is not a mapping"),
        (
            "project: p\nname: n\nkind: robot\norg: o\nserver: {host: h, port: 1}\n",
            "kind: 'robot' is not one of server, site, admin",
        ),
        (
            "project: p\nname: n\nkind: admin\norg: o\nserver: {host: h, port: 1}\n",
            "role: expected a non-empty string",
        ),
        (
            "project: p\nname: n\nkind: site\norg: o\nserver: {host: h, port: 99999}\n",
            "server.port: expected a port number",
        ),
        ("project: p\nname: n\nkind: site\norg: o\nserver: h:1\n", "server: expected {host"),
        (
            "project: p\nkind: site\norg: o\nserver: {host: h, port: 1}\nextra: 1\n",
            "extra: unknown key",
        ),
        (
            "project: p\nname: n\nkind: server\norg: o\nserver: {host: h, port: 1}\n",
            "listen: expected {host",
        ),
    ],
)
def test_a_corrupt_kit_yaml(site_kit: Path, text: str, expected: str) -> None:
    (site_kit / "startup" / "kit.yaml").write_text(text)
    with pytest.raises(KitError) as info:
        load_kit(site_kit)
    assert expected in str(info.value)
    assert str(site_kit / "startup" / "kit.yaml") in str(info.value)


def test_all_problems_of_a_kit_yaml_are_listed(site_kit: Path) -> None:
    (site_kit / "startup" / "kit.yaml").write_text("kind: site\nserver: {host: h, port: 0}\n")
    with pytest.raises(KitError) as info:
        load_kit(site_kit)
    for part in ("project:", "name:", "org:", "server.port:"):
        assert part in str(info.value)


def test_the_rendered_kit_yaml_round_trips(tmp_path: Path) -> None:
    text = render_kit_yaml(
        project="p", name="server", kind="server", org="p", server_host="::1", server_port=9,
        listen=("::", 8443),
    )  # fmt: skip
    assert text.startswith("# atoll startup kit")
    assert yaml.safe_load(text) == {
        "project": "p", "name": "server", "kind": "server", "org": "p",
        "server": {"host": "::1", "port": 9}, "listen": {"host": "::", "port": 8443},
        "workspace": "workspace",
    }  # fmt: skip
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / "kit.yaml").write_text(text)
    for name in ("server.crt", "server.key", "rootCA.pem", "project.json"):
        (startup / name).write_text("x")
    kit = load_kit(tmp_path)
    assert kit.server_address == "[::1]:9"
    assert kit.listen_address == "[::]:8443"


def test_only_a_server_kit_has_a_listen_address(site_kit: Path) -> None:
    kit: Kit = load_kit(site_kit)
    with pytest.raises(KitError, match="only a server kit"):
        _ = kit.listen_address


def test_a_workspace_may_be_moved(site_kit: Path, tmp_path: Path) -> None:
    path = site_kit / "startup" / "kit.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["workspace"] = str(tmp_path / "elsewhere")
    path.write_text(yaml.safe_dump(doc))
    assert load_kit(site_kit).workspace == tmp_path / "elsewhere"
