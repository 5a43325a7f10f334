"""The server moves to another host name without a new CA (issue 36): a running federation's
server goes from 127.0.0.1 to 127.0.0.2, the documented way. With its old certificate the new
name is refused by TLS; `atoll provision move-server` re-issues it, the running site follows its
edited kit without a restart, a user's own copy of their kit works once its `server` is edited,
and a new job completes."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from atoll.admin.errors import ConnectionFailed
from atoll.admin.session import Session
from atoll.pki.kit import edit_kit_yaml, load_kit
from tests.integration.federation.harness import Federation, wait_for
from tests.integration.federation.jobs import make_job

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
NEW_HOST = "127.0.0.2"  # loopback, but not a name the provisioned certificate holds


def _online(session) -> set[str]:
    return {x["name"] for x in session.sites()["sites"] if x["online"]}


def test_the_server_moves_to_a_new_name_and_every_kit_follows(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS)
    # A user's own copy of their kit, outside the project folder: only its owner edits it.
    own_kit = shutil.copytree(fed.kit(ADMIN), tmp_path / "users-own-kit")
    try:
        fed.start_all()
        fed.wait_online(ADMIN)
        port = load_kit(fed.kit("server")).server_port

        # Moved without a new certificate: the server answers on the new name, but its
        # certificate does not hold it, so TLS refuses the user who dials it there.
        fed.kill("server")
        edit_kit_yaml(fed.kit("server"), listen={"host": NEW_HOST, "port": port})
        fed.start_server()
        edit_kit_yaml(own_kit, server={"host": NEW_HOST, "port": port})
        with pytest.raises(ConnectionFailed) as refused, Session(own_kit) as s:
            s.sites()
        assert "certificate that does not hold that name" in str(refused.value), refused.value

        # The documented move: a new certificate from the same CA, then the server restarted.
        fed.kill("server")
        moved = subprocess.run(
            [sys.executable, "-m", "atoll", "provision", "move-server", str(fed.root),
             "--host", NEW_HOST], capture_output=True, text=True, timeout=60)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "site-1" in moved.stdout and f"{NEW_HOST}:{port}" in moved.stdout, moved.stdout
        server_kit = load_kit(fed.kit("server"))
        assert (server_kit.server_host, server_kit.listen_host) == (NEW_HOST, NEW_HOST)
        assert load_kit(fed.kit("site-1")).server_host == NEW_HOST
        fed.start_server()

        # The site never restarted: it read its edited kit and dialled the new address.
        site = fed.procs["site-1"]
        with Session(own_kit) as s:
            wait_for(lambda: "site-1" in _online(s), 60, "site-1 online at the new address")
            job = s.submit(make_job(tmp_path / "after-move"), wait=True, timeout=120)
            assert job["state"] == "FINISHED:COMPLETED", job
        assert site.poll() is None, "the site parent restarted or died"
        assert f"dialling {NEW_HOST}:{port}" in fed.log("site-1")
    finally:
        fed.stop_all()
