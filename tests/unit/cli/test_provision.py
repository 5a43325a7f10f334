"""`atoll provision` as a user types it: the default form, the subcommands, errors with code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.provision import provision_group

PROJECT = """\
name: demo
server: {host: localhost, port: 8443}
sites: [{name: site-1, org: org-1}]
users: [{name: admin@demo.org, org: demo, role: project_admin}]
studies: {s1: {sites: [site-1], admins: [admin@demo.org]}}
"""


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def project_file(tmp_path: Path) -> Path:
    path = tmp_path / "project.yaml"
    path.write_text(PROJECT)
    return path


def test_provision_project_file_out_dir(runner: CliRunner, project_file: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = runner.invoke(provision_group, [str(project_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"Provisioned demo in {out}/demo/" in result.output
    for line in ("ca/", "server/", "site-1/", "admin@demo.org/"):
        assert f"  {line}" in result.output
    assert "The server listens on 127.0.0.1:8443 and is dialled at localhost:8443" in result.output
    assert (out / "demo" / "site-1" / "startup" / "client.key").is_file()


def test_options_may_come_first(runner: CliRunner, project_file: Path, tmp_path: Path) -> None:
    result = runner.invoke(provision_group, ["--out", str(tmp_path / "o"), str(project_file)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "demo" / "server" / "startup" / "server.crt").is_file()


def test_an_invalid_project_lists_every_problem_and_exits_2(
    runner: CliRunner, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Demo\nserver: {host: localhost, port: 0}\nsites: [{name: x}]\n")
    result = runner.invoke(provision_group, [str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"error: {bad}: 3 problems" in result.output
    assert "  - name: 'Demo' is not a valid project name" in result.output
    assert "  - server.port: must be at least 1, not 0" in result.output
    assert "  - sites[0].org: required key is missing" in result.output
    assert not (tmp_path / "o").exists()


def test_an_existing_project_needs_force(runner: CliRunner, project_file: Path, tmp_path: Path):
    args = [str(project_file), "--out", str(tmp_path / "o")]
    assert runner.invoke(provision_group, args).exit_code == 0
    result = runner.invoke(provision_group, args)
    assert result.exit_code == 2
    assert "already exists; pass --force" in result.output
    assert runner.invoke(provision_group, [*args, "--force"]).exit_code == 0


def test_add_site_and_add_user(runner: CliRunner, project_file: Path, tmp_path: Path) -> None:
    runner.invoke(provision_group, [str(project_file), "--out", str(tmp_path)])
    project = str(tmp_path / "demo")
    result = runner.invoke(
        provision_group, ["add-site", project, "--name", "site-2", "--org", "o2"]
    )
    assert result.exit_code == 0, result.output
    assert "Added site site-2 (o2):" in result.output
    assert "No other kit was changed" in result.output
    result = runner.invoke(
        provision_group,
        ["add-user", project, "--name", "bob@o2.org", "--org", "o2", "--role", "lead"],
    )
    assert result.exit_code == 0, result.output
    assert "bob@o2.org/  admin   org o2, role lead" in result.output
    assert (tmp_path / "demo" / "bob@o2.org" / "startup" / "client.crt").is_file()


def test_add_site_errors_exit_2(runner: CliRunner, project_file: Path, tmp_path: Path) -> None:
    runner.invoke(provision_group, [str(project_file), "--out", str(tmp_path)])
    project = str(tmp_path / "demo")
    result = runner.invoke(provision_group, ["add-site", project, "--name", "site-1", "--org", " "])
    assert result.exit_code == 2
    assert "2 problems" in result.output
    assert "  - name: 'site-1' is already provisioned (the site 'site-1')" in result.output
    assert "  - org: ' ' is not a valid org" in result.output
    result = runner.invoke(
        provision_group, ["add-site", str(tmp_path), "--name", "a", "--org", "o"]
    )
    assert result.exit_code == 2
    assert "not a provisioned project folder" in result.output


def test_help_shows_the_default_form(runner: CliRunner) -> None:
    result = runner.invoke(provision_group, ["--help"])
    assert result.exit_code == 0
    assert "PROJECT.yaml --out DIR [--force] | COMMAND [ARGS]..." in result.output
    assert "add-site" in result.output and "add-user" in result.output
    assert "create" not in result.output.split("Commands:")[1]
    result = runner.invoke(provision_group, ["project.yaml", "--help"], prog_name="atoll provision")
    assert "Usage: atoll provision PROJECT.yaml --out DIR [--force]" in result.output
    assert "--out DIRECTORY" in result.output


def test_missing_out_is_a_usage_error(runner: CliRunner, project_file: Path) -> None:
    result = runner.invoke(provision_group, [str(project_file)])
    assert result.exit_code == 2
    assert "Missing option '--out'" in result.output
