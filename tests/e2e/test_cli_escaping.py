"""Names and messages from other users print escaped on a terminal: the real CLI, on a
pseudo-terminal, against a real server. A job name that clears the screen and forges a table
row must show as text, in its own row."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from tests.integration.federation.harness import Federation, job_folder

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
NAME = "a\x1b[2J\nb\u202ec"  # clears the screen, breaks the line, reverses what follows
SHOWN = "a\\x1b[2J\\nb\\u202ec"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server alone: the job waits for its site, which never comes."""
    fed = Federation.provisioned(tmp_path_factory.mktemp("escaping"), ["site-1"], USERS)
    fed.start_server()
    yield fed
    fed.stop_all()


def on_terminal(args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run the CLI with a pseudo-terminal as its stdin, stdout and stderr; all it printed."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "atoll", *args], stdin=secondary,
                            stdout=secondary, stderr=secondary, env=env, close_fds=True)
    os.close(secondary)
    out = bytearray()
    try:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the CLI exited and the terminal closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(primary)
    return proc.wait(timeout=60), bytes(out)


def test_job_list_and_status_escape_a_hostile_job_name(server, tmp_path):
    job = job_folder(tmp_path / "job", {"name": NAME, "deploy_map": {"app": ["@ALL"]}},
                     "server: {}\n", {})
    with server.session(ADMIN) as s:
        job_id = s.submit(job)["job_id"]
    env = {**os.environ, "ATOLL_HOME": str(tmp_path / "home"),
           "ATOLL_KIT": str(server.kit(ADMIN))}

    code, out = on_terminal(["job", "list"], env)
    assert code == 0, out
    assert b"\x1b" not in out and "\u202e".encode() not in out
    rows = out.decode().splitlines()
    assert len(rows) == 2, rows  # the header and the job: no forged row
    assert rows[1].startswith(job_id) and SHOWN in rows[1]

    code, out = on_terminal(["job", "status", job_id], env)
    assert code == 0, out
    assert b"\x1b" not in out and f"'{SHOWN}'".encode() in out

    code, out = on_terminal(["job", "list", "--format", "json"], env)
    assert code == 0 and b"\x1b" not in out  # JSON escapes it its own way
    assert json.loads(out.decode())[0]["name"] == NAME
