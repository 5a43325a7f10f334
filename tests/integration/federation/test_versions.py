"""The version policy at the server's door (spec/versions.py, docs/operations.md, Versions): a
real site parent that runs a newer atoll than its server is refused at connect and its log
says both versions and what to upgrade; the same site at the server's version then joins."""

from __future__ import annotations

import os
import subprocess
import sys

from atoll import __version__
from tests.integration.federation.harness import Federation, wait_for

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
NEWER = "9.0.0"
# The site parent's own entry, in a process whose atoll says it is NEWER.
AS_NEWER = ("import sys, atoll; atoll.__version__ = sys.argv[1]; "
            "from atoll.parent.run import main; main(sys.argv[2:])")
AS_NEWER_CLI = ("import runpy, sys, atoll; atoll.__version__ = sys.argv[1]; "
                "sys.argv = ['atoll', *sys.argv[2:]]; runpy.run_module('atoll', run_name='__main__')")


def online(fed: Federation) -> set[str]:
    with fed.session(ADMIN) as s:
        return {x["name"] for x in s.sites()["sites"] if x["online"]}


def test_a_site_newer_than_its_server_is_refused_with_both_versions(tmp_path):
    fed = Federation.provisioned(tmp_path, ["site-1"], USERS)
    try:  # the server stops however the test ends (a mutated defence fails it midway)
        fed.start_server()
        log_path = tmp_path / "newer-site.log"
        with open(log_path, "ab") as log:
            newer = subprocess.Popen([sys.executable, "-c", AS_NEWER, NEWER, "site",
                                      str(fed.kit("site-1"))], stdout=log, stderr=log,
                                     start_new_session=True)
        try:
            expected = (f"this site runs atoll {NEWER}, newer than the server's {__version__}: "
                        "upgrade the server first")
            wait_for(lambda: expected in log_path.read_text(errors="replace"), 60,
                     what="the newer site to be told why it was refused")
            assert "FAILED_PRECONDITION" in log_path.read_text()
            assert f"refused site site-1: {expected}" in fed.log("server")
            assert online(fed) == set()
        finally:
            newer.terminate()
            newer.wait(30)
        fed.start_site("site-1")
        fed.wait_online(ADMIN)
        # a user's CLI newer than the server logs in, warned with both versions
        env = {**os.environ, "ATOLL_HOME": str(tmp_path / "home")}
        login = subprocess.run([sys.executable, "-c", AS_NEWER_CLI, NEWER, "login", "--kit",
                                str(fed.kit(ADMIN))], capture_output=True, text=True, env=env,
                               timeout=120)
        assert login.returncode == 0, login.stderr
        assert (f"warning: this CLI runs atoll {NEWER}, newer than the server's {__version__}"
                in login.stderr), login.stderr
        same = subprocess.run([sys.executable, "-m", "atoll", "login", "--kit",
                               str(fed.kit(ADMIN))], capture_output=True, text=True, env=env,
                              timeout=120)
        assert same.returncode == 0 and "warning" not in same.stderr, same.stderr
    finally:
        fed.stop_all()
