"""On a real one-site federation: `job init` fits the study it is logged in to, and every
command answers in JSON, errors included (issue 25, wrong turns 5 and 10)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.newcomer import cli  # noqa: F401 - the fixture


def test_one_site_federation_init_submit_and_json_everywhere(cli, tmp_path):  # noqa: F811
    up = json.loads(cli("poc", "up", "--sites", "1", "--format", "json").stdout)
    assert up["sites"] == ["site-1"] and up["study"] == "default"

    init = cli("job", "init", "myjob")
    assert "min_clients: 1 (the 1 site of study default)" in init.stdout
    assert "--kit" not in init.stdout  # logged in: `atoll job submit myjob` is all it takes
    assert "atoll job submit myjob\n" in init.stdout
    assert json.loads((tmp_path / "myjob" / "meta.json").read_text())["min_clients"] == 1

    done = json.loads(cli("job", "submit", "myjob", "--wait", "--timeout", "240",
                          "--format", "json").stdout)
    assert done["state"] == "FINISHED:COMPLETED"
    got = json.loads(cli("job", "download", done["job_id"], "--out", "dl", "--format",
                         "json").stdout)
    assert got == {"job_id": done["job_id"], "path": str(tmp_path / "dl" / done["job_id"])}
    assert (Path(got["path"]) / "results" / "summary.json").is_file()

    missing = cli("job", "status", "0" * 32, "--format", "json", check=False)
    assert missing.returncode == 5 and missing.stderr == ""
    error = json.loads(missing.stdout)["error"]
    assert (error["code"], error["exit_code"]) == ("NOT_FOUND", 5)
    assert "no such job" in error["message"]

    login = json.loads(cli("login", "--kit", up["admin_kit"], "--format", "json").stdout)
    assert login["user"] == up["user"] and login["study"] == "default"
    again = cli("poc", "up", "--format", "json", check=False)
    assert again.returncode == 2 and "error" in json.loads(again.stdout)

    down = json.loads(cli("poc", "down", "--format", "json").stdout)
    assert down["stopped"] == 2
