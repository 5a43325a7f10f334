"""Wrong turn 1: `atoll poc up` kept nothing (a new CA and an empty job store at every call),
and after a server crash it left the old site parents running, so that `poc down` later
reported success with two site parents still up. Now the workspace keeps its state and no
process of it outlives `poc down`."""

from __future__ import annotations

import json
import os
import signal

from tests.e2e.newcomer import cli  # noqa: F401 - the fixture


def _pid(cli, kit: str, role: str) -> int:  # noqa: F811
    path = cli.workspace / "poc" / kit / "workspace" / f"{role}.pid"
    return json.loads(path.read_text())["pid"]


def test_up_after_a_server_crash_restarts_the_same_federation(cli):  # noqa: F811
    cli("poc", "up", "--sites", "2")
    ca = (cli.workspace / "poc" / "ca" / "rootCA.pem").read_bytes()
    cli("job", "init", "myjob")
    cli("job", "submit", "myjob", "--wait")
    [job] = cli.json("job", "list")

    os.kill(_pid(cli, "server", "server"), signal.SIGKILL)  # the server crashes
    again = cli("poc", "up")
    assert "restarted" in again.stdout and "1 job(s) kept" in again.stdout
    assert (cli.workspace / "poc" / "ca" / "rootCA.pem").read_bytes() == ca
    assert [j["job_id"] for j in cli.json("job", "list")] == [job["job_id"]]
    assert len(cli.workspace_processes()) == 3  # one server, two sites: no orphan beside them

    cli("poc", "down")
    assert cli.workspace_processes() == []


def test_down_leaves_nothing_even_when_a_pid_file_was_lost(cli):  # noqa: F811
    cli("poc", "up", "--sites", "2")
    (cli.workspace / "poc" / "site-1" / "workspace" / "site.pid").unlink()
    assert "stopped 3 parent(s)" in cli("poc", "down").stdout
    assert cli.workspace_processes() == []


def test_reset_starts_afresh_and_a_running_federation_is_left_alone(cli):  # noqa: F811
    cli("poc", "up", "--sites", "1")
    cli("job", "init", "myjob", "--sites", "site-1")
    cli("job", "submit", "myjob", "--wait")
    running = cli("poc", "up", check=False)
    assert running.returncode == 2 and "already runs" in running.stderr
    cli("poc", "down")
    other = cli("poc", "up", "--sites", "2", check=False)
    assert other.returncode == 2 and "--reset" in other.stderr
    fresh = cli("poc", "up", "--reset", "--sites", "2")
    assert "provisioned" in fresh.stdout
    assert cli.json("job", "list") == []
    assert {s["name"] for s in cli.json("site", "list")["sites"]} == {"site-1", "site-2"}
