"""Every command that prints a result has --format json, and with it stdout is one JSON
document: the result, or {"error": {...}} (wrong turn 10 of issue 25)."""

from __future__ import annotations

import json

import click
import pytest
import yaml
from click.testing import CliRunner

from atoll.cli.main import cli
from atoll.spec.errors import EXIT_CODES


def _leaves(command: click.Command, path: list[str], ctx: click.Context):
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            yield from _leaves(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))
    else:
        yield " ".join(path), command


def test_every_command_has_format_json():
    with click.Context(cli, info_name="atoll") as ctx:
        leaves = dict(_leaves(cli, ["atoll"], ctx))
    assert len(leaves) > 30
    missing = [name for name, command in leaves.items()
               if not any(p.name == "fmt" and "json" in getattr(p.type, "choices", ())
                          for p in command.params)]
    assert missing == []


def _run(*args: str, home):
    return CliRunner().invoke(cli, list(args), env={"ATOLL_HOME": str(home)})


def test_provision_and_its_errors_answer_in_json(tmp_path):
    project = tmp_path / "project.yaml"
    project.write_text(yaml.safe_dump({
        "name": "demo", "server": {"name": "server", "host": "127.0.0.1", "port": 8443},
        "sites": [{"name": "site-a", "org": "a"}],
        "users": [{"name": "admin@x.org", "org": "x", "role": "project_admin"}]}))
    made = _run("provision", str(project), "--out", str(tmp_path / "kits"), "--format", "json",
                home=tmp_path)
    assert made.exit_code == 0, made.output
    answer = json.loads(made.stdout)
    assert answer["project"] == "demo"
    assert {k["name"] for k in answer["kits"]} == {"server", "site-a", "admin@x.org"}
    added = _run("provision", "add-user", answer["project_dir"], "--name", "lead@x.org",
                 "--org", "x", "--role", "lead", "--format", "json", home=tmp_path)
    assert json.loads(added.stdout)["added"]["role"] == "lead"
    again = _run("provision", "add-user", answer["project_dir"], "--name", "lead@x.org",
                 "--org", "x", "--role", "lead", "--format", "json", home=tmp_path)
    error = json.loads(again.stdout)["error"]
    assert again.exit_code == 2 and error["code"] == "INVALID" and "lead@x.org" in error["message"]
    assert again.stderr == ""


def test_job_init_answers_in_json_and_says_where_min_clients_came_from(tmp_path):
    result = _run("job", "init", str(tmp_path / "job"), "--sites", "a,b,c", "--format", "json",
                  home=tmp_path)
    answer = json.loads(result.stdout)
    assert answer["min_clients"] == 3 and answer["min_clients_from"] == "the sites of --sites"
    assert json.loads((tmp_path / "job" / "meta.json").read_text())["min_clients"] == 3


def test_job_init_without_a_study_leaves_min_clients_out_and_says_so(tmp_path):
    result = _run("job", "init", str(tmp_path / "job"), home=tmp_path)
    assert result.exit_code == 0
    assert "min_clients: not set (not logged in" in result.stdout
    assert "min_clients" not in json.loads((tmp_path / "job" / "meta.json").read_text())
    assert "--kit ADMIN_KIT" in result.stdout  # not logged in: the hint is needed


def test_logout_answers_in_json(tmp_path):
    assert json.loads(_run("logout", "--format", "json", home=tmp_path).stdout) == {
        "logged_out": False}


@pytest.mark.parametrize("code, name, _", EXIT_CODES)
def test_every_exit_code_is_in_the_cli_reference(code, name, _):
    from pathlib import Path

    reference = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    assert f"| {code} | `{name}` |" in reference


def test_a_mistyped_command_line_is_one_error_line_too(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATOLL_HOME": str(tmp_path)}
    typo = subprocess.run([sys.executable, "-m", "atoll", "job", "frob"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.endswith("\nerror: No such command 'frob'.\n")
    assert "Try 'atoll job -h' for help." in typo.stderr
    missing = subprocess.run([sys.executable, "-m", "atoll", "job", "status", "--format", "json"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stderr == ""
    assert json.loads(missing.stdout) == {"error": {
        "code": "INVALID", "exit_code": 2, "message": "Missing argument 'JOB_ID'."}}
