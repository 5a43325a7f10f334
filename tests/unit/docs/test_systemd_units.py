"""The systemd units of deploy/systemd/ run the command docs/operations.md shows: the parent in
the foreground (its log to the journal), stopped by SIGTERM to the parent alone, not restarted
on a configuration error (exit 2)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.main import cli
from atoll.spec.errors import EXIT_INVALID
from tests.unit.docs.markdown import ROOT

UNITS = {"atoll-server.service": ["server", "start"], "atoll-site@.service": ["site", "start"]}


@pytest.mark.parametrize("name", UNITS)
def test_a_unit_runs_its_parent_in_the_foreground_and_stops_it_in_order(name):
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str
    unit.read_string((ROOT / "deploy" / "systemd" / name).read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/bin/atoll") and argv[1:3] == UNITS[name], argv
    assert "--detach" not in argv and service["Type"] == "simple"
    assert service["KillMode"] == "mixed" and service["User"] != "root"
    assert service["RestartPreventExitStatus"] == str(EXIT_INVALID)
    assert "RestrictNamespaces" not in service  # bubblewrap makes namespaces
    # the command exists with these arguments
    assert CliRunner().invoke(cli, [*argv[1:3], "--help"]).exit_code == 0
    assert name in (ROOT / "docs" / "operations.md").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
@pytest.mark.parametrize("name", UNITS)
def test_systemd_accepts_the_unit(name, tmp_path):
    """`systemd-analyze verify`, with ExecStart pointing at this venv's atoll."""
    text = (ROOT / "deploy" / "systemd" / name).read_text()
    atoll = Path(sys.executable).parent / "atoll"
    unit = tmp_path / name.replace("@.", "@test.")
    unit.write_text(text.replace("/opt/atoll/venv/bin/atoll", str(atoll)))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60)
    problems = [line for line in (done.stdout + done.stderr).splitlines()
                if unit.name in line or "Unknown" in line or "Failed" in line]
    assert done.returncode == 0 and problems == [], done.stdout + done.stderr
