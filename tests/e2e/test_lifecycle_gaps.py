"""Wrong turns 4, 6, 9 and 10 (delete, watch, follow), on a real local federation:

4. `provision add-user` then `study add-user` looped until the new user had logged in once;
6. a project admin asking for an unknown study was told to add themselves to it;
9. `site render` said yes (exit 0, a note) where the running site says no;
10. no `job delete` (so a study that ever had a job could never be removed), no `watch`, no
    way to re-attach to a job (`status --wait`, `logs --follow`).
"""

from __future__ import annotations

import pytest

from tests.e2e.newcomer import cli  # noqa: F401 - the fixture

NEW_USER = "new@poc.local"


@pytest.fixture
def poc(cli):  # noqa: F811
    cli("poc", "up", "--sites", "2")
    return cli


def test_a_new_user_is_added_to_a_study_before_their_first_login(poc):
    project = str(poc.workspace / "poc")
    poc("provision", "add-user", project, "--name", NEW_USER, "--org", "poc", "--role", "lead")
    poc("study", "create", "trial", "--site", "site-1")
    added = poc.json("study", "add-user", "trial", NEW_USER)
    assert NEW_USER in added["users"]
    kit = str(poc.workspace / "poc" / NEW_USER)
    assert poc.json("job", "list", "--kit", kit, "--study", "trial") == []  # in, at once


def test_a_project_admin_asking_for_an_unknown_study_is_told_it_does_not_exist(poc):
    asked = poc("job", "list", "--study", "ghost", check=False)
    assert asked.returncode == 2
    assert "no such study: ghost" in asked.stderr and "add-user" not in asked.stderr
    again = poc("study", "add-user", "ghost", "admin@poc.local", check=False)
    assert "no such study: ghost" in again.stderr


def test_site_render_refuses_what_the_running_site_refuses(poc):
    poc("study", "create", "trial", "--site", "site-1", "--user", "admin@poc.local")
    poc("job", "init", "myjob", "--sites", "site-1")
    site_kit = str(poc.workspace / "poc" / "site-1")
    rendered = poc("site", "render", site_kit, "myjob", "--study", "trial", check=False)
    assert rendered.returncode == 2
    assert "site site-1 does not map study 'trial'" in rendered.stderr
    ran = poc("job", "submit", "myjob", "--study", "trial", "--wait", check=False)
    assert ran.returncode == 1
    assert "site site-1 does not map study 'trial'" in ran.stdout
    assert poc("site", "render", site_kit, "myjob", "--study", "default").returncode == 0


def test_delete_a_job_then_remove_its_study(poc):
    poc("study", "create", "trial", "--site", "site-1", "--user", "admin@poc.local")
    poc("job", "init", "myjob", "--sites", "site-1")
    poc("job", "submit", "myjob", "--study", "trial", "--wait", check=False)  # site-1: no map
    [job] = poc.json("job", "list", "--study", "trial")
    kept = poc("study", "remove", "trial", check=False)
    assert kept.returncode == 2 and "atoll job delete" in kept.stderr
    poc("job", "delete", job["job_id"], "--study", "trial")
    gone = poc("job", "status", job["job_id"], "--study", "trial", check=False)
    assert gone.returncode == 5
    assert not (poc.workspace / "poc" / "server" / "workspace" / "jobs" / job["job_id"]).exists()
    audit = poc.json("audit", "--only-study", "trial")["entries"]
    assert any(e["action"] == "delete" and e["target"] == job["job_id"] for e in audit)
    poc("study", "remove", "trial")


def test_watch_status_wait_and_logs_follow_reattach_to_a_running_job(poc):
    poc("job", "init", "myjob")
    job = poc.json("job", "submit", "myjob")
    follow = poc.popen("job", "logs", job["job_id"], "--follow")
    watched = poc("job", "watch", job["job_id"])
    assert "round 5:" in watched.stdout and "FINISHED:COMPLETED" in watched.stdout
    out, err = follow.communicate(timeout=120)
    assert follow.returncode == 0, err
    assert "==> server <==" in out and out.rstrip().endswith("FINISHED:COMPLETED")
    assert "FINISHED:COMPLETED" in poc("job", "status", job["job_id"], "--wait").stdout
    assert "watch" in poc("job", "--help").stdout
