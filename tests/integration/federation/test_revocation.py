"""Revocation on a real federation: the project admin revokes with `atoll provision revoke`,
pushes the list with `atoll crl push`, and from then on the server refuses every call of a
revoked certificate (a login session opened before included), closes a revoked site's link and
keeps refusing it, and the jobs of a revoked user that were still waiting are cancelled."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from atoll.admin.errors import AuthError
from tests.integration.federation.harness import Federation, wait_for
from tests.integration.federation.jobs import make_job

ADMIN = "admin@test.org"
LEAVER = "leaver@test.org"
LEAD = "lead@test.org"
SPARE = "spare@test.org"  # revoked by the site test to make an older list of its own
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"},
         {"name": LEAVER, "org": "test", "role": "lead"},
         {"name": LEAD, "org": "test", "role": "lead"},
         {"name": SPARE, "org": "test", "role": "member"}]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), ["site-1", "site-2"], USERS)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def atoll(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, with their own saved session (ATOLL_HOME)."""
    proc = subprocess.run([sys.executable, "-m", "atoll", *args], capture_output=True, text=True,
                          env={**os.environ, "ATOLL_HOME": str(home)}, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"atoll {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def list_number(fed: Federation, home: Path) -> int:
    """The number of the revocation list the server holds now (0: none yet)."""
    shown = atoll("crl", "show", "--kit", str(fed.kit(ADMIN)), "--format", "json", home=home)
    return int(shown.stdout.split('"number": ')[1].split(",")[0])


def online(fed: Federation) -> set[str]:
    with fed.session(ADMIN) as s:
        return {x["name"] for x in s.sites()["sites"] if x["online"]}


def refusals(fed: Federation, site: str) -> int:
    """How many times the server has refused ``site``'s link as revoked, by the site's log."""
    return fed.log(site).count("this certificate is revoked")


def test_a_revoked_users_cli_is_refused_at_once_and_the_sites_refuse_their_waiting_job(
        federation, tmp_path):
    fed = federation
    admin_home, leaver_home = tmp_path / "admin-home", tmp_path / "leaver-home"
    atoll("login", "--kit", str(fed.kit(LEAVER)), home=leaver_home)
    assert atoll("job", "list", home=leaver_home).returncode == 0

    # site-2 is away: the leaver's job waits on the server (SUBMITTED, not dispatched)
    fed.kill("site-2")
    wait_for(lambda: "site-2" not in online(fed), 60, what="site-2 to go offline")
    with fed.session(LEAVER) as s:
        waiting = s.submit(make_job(tmp_path / "waiting"))
    assert waiting["state"] == "SUBMITTED"

    number = list_number(fed, admin_home) + 1  # whichever test ran before
    revoked = atoll("provision", "revoke", str(fed.root), LEAVER, "--reason",
                    "affiliation-changed", home=admin_home)
    assert f"revocation list {number}" in revoked.stdout
    crl = fed.root / "ca" / "crl.pem"
    pushed = atoll("crl", "push", str(crl), "--kit", str(fed.kit(ADMIN)), home=admin_home)
    assert f"revocation list {number} (" in pushed.stdout

    # at once: the saved login session, and any new connection, are refused
    refused = atoll("job", "list", home=leaver_home, check=False)
    assert refused.returncode == 4, refused.stderr
    assert "this certificate is revoked" in refused.stderr
    assert "affiliation-changed" in refused.stderr
    with pytest.raises(AuthError, match="revoked"):
        fed.session(LEAVER).list_jobs()
    assert atoll("job", "list", "--kit", str(fed.kit(LEAD)), home=tmp_path / "lead").returncode == 0

    # the waiting job is cancelled at once, with the reason; the site that was away gets the
    # list when it connects (tests/security/test_hostile_server_revocation.py: the sites
    # refuse such a job even when a server dispatches it)
    assert waiting["job_id"] in pushed.stdout
    fed.start_site("site-2")
    with fed.session(ADMIN) as s:
        job = s.wait(waiting["job_id"], timeout=120)
    assert job["state"] == "FINISHED:ABORTED", job
    assert job["reason"].startswith("cancelled: the submitter's certificate was revoked"), job
    assert f"affiliation-changed; revocation list {number}" in job["reason"], job
    for site in ("site-1", "site-2"):
        assert job["parts"][site]["reason"] == job["reason"], (site, job)
    wait_for(lambda: (fed.workspace("site-2") / "crl.pem").exists(), 60,
             what="site-2 to keep the list it was sent")
    held = fed.workspace("site-2") / "crl.pem"
    assert held.read_text() == crl.read_text()
    assert stat.S_IMODE(held.stat().st_mode) == 0o600
    assert stat.S_IMODE((fed.workspace("server") / "crl.pem").stat().st_mode) == 0o600

    with fed.session(ADMIN) as s:
        entries = s.call("audit")["entries"]
    assert any(e["action"] == "crl_push" and e["outcome"] == "ok" for e in entries)
    assert any(e["outcome"] == "refused" and "revoked" in e["detail"] for e in entries)


def test_a_revoked_site_is_dropped_and_refused_and_lists_only_move_forward(federation, tmp_path):
    fed = federation
    home = tmp_path / "admin-home"
    admin_kit = str(fed.kit(ADMIN))
    wait_for(lambda: {"site-1", "site-2"} <= online(fed), 60, what="both sites online")
    # A list of its own to be the older one, whichever test ran before
    atoll("provision", "revoke", str(fed.root), SPARE, "--reason", "superseded", home=home)
    atoll("crl", "push", str(fed.root / "ca" / "crl.pem"), "--kit", admin_kit, home=home)
    number = list_number(fed, home)
    older = tmp_path / "older.pem"
    shutil.copy(fed.root / "ca" / "crl.pem", older)

    atoll("provision", "revoke", str(fed.root), "site-2", "--reason", "key-compromise",
          home=home)
    pushed = atoll("crl", "push", str(fed.root / "ca" / "crl.pem"), "--kit", admin_kit,
                   home=home)
    assert "Closed the links of: site-2." in pushed.stdout
    wait_for(lambda: "site-2" not in online(fed), 60, what="site-2's link to be closed")
    # The site dials again, and is refused again: seen in its own log, not assumed after a pause
    seen = refusals(fed, "site-2")
    wait_for(lambda: refusals(fed, "site-2") > seen, 60, what="site-2 to be refused once more")
    assert online(fed) == {"site-1"}
    assert "key-compromise" in fed.log("site-2")

    # pushing the same list again changes nothing; an older one, or one by a lead, is refused
    again = atoll("crl", "push", str(fed.root / "ca" / "crl.pem"), "--kit", admin_kit, home=home)
    assert "it already held this list" in again.stdout
    stale = atoll("crl", "push", str(older), "--kit", admin_kit, home=home, check=False)
    assert stale.returncode == 2 and "older than the number" in stale.stderr, stale.stderr
    lead = atoll("crl", "push", str(fed.root / "ca" / "crl.pem"), "--kit", str(fed.kit(LEAD)),
                 home=tmp_path / "lead", check=False)
    assert lead.returncode == 2 and "only project admins" in lead.stderr, lead.stderr

    # a restarted server enforces the list it kept: the site dials the new server and is refused
    fed.kill("server")
    seen = refusals(fed, "site-2")
    fed.start_server()
    fed.wait_online(ADMIN, sites=["site-1"], timeout=30)
    wait_for(lambda: refusals(fed, "site-2") > seen, 60,
             what="the restarted server to refuse site-2")
    assert online(fed) == {"site-1"}
    shown = atoll("crl", "show", "--kit", admin_kit, home=home).stdout
    assert f"Revocation list {number + 1}" in shown and "key-compromise" in shown
