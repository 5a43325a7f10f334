"""The site's own log of the jobs it ran or refused (site/job_log.py, `atoll site jobs`)."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.main import cli
from atoll.pki.identity import Identity
from atoll.pki.job_signature import Signed, Statement
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from atoll.site.job_log import LOG_FILE, JobLog, read_log

PROJECT = {"name": "logs", "server": {"host": "127.0.0.1", "port": 8443},
           "sites": [{"name": "site-a", "org": "org-a"}],
           "users": [{"name": "lead@a.org", "org": "org-a", "role": "lead"}],
           "studies": {"alpha": {"sites": ["site-a"], "admins": ["lead@a.org"]}}}
SIGNED = Signed(Identity("lead@a.org", "org-a", "admin", "lead"),
                Statement("logs", "alpha", "lead@a.org", 1, {"meta.json": "ab" * 32}, "n"),
                b"", "sha256:" + "cd" * 32)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return provision(parse_project(PROJECT), tmp_path_factory.mktemp("kits")).project_dir


@pytest.fixture
def kit(project, tmp_path):
    shutil.copytree(project / "site-a", tmp_path / "site-a")
    site = load_kit(tmp_path / "site-a")
    site.workspace.mkdir(parents=True, exist_ok=True)
    return site


def jobs(kit, *args):
    return CliRunner().invoke(cli, ["site", "jobs", str(kit.kit_dir), *args])


def test_decisions_survive_a_new_parent_and_chain(kit):
    JobLog(kit.workspace).record("job-1", "alpha", "launched", SIGNED)
    JobLog(kit.workspace).record("job-2", "alpha", "refused", None, "not authorized here",
                                 server_submitter="lead@a.org")
    log = JobLog(kit.workspace)  # a restarted parent continues the chain
    log.record("job-1", "alpha", "finished:COMPLETED", SIGNED)
    read = read_log(kit.workspace / LOG_FILE)
    assert read.broken is None
    assert [(r["job_id"], r["decision"]) for r in read.lines] == [
        ("job-1", "launched"), ("job-2", "refused"), ("job-1", "finished:COMPLETED")]
    assert read.lines[0]["job_digest"] == SIGNED.digest
    assert read.lines[0]["statement_digest"] == SIGNED.statement_digest
    assert read.lines[1]["submitter"] == "" and read.lines[1]["server_submitter"] == "lead@a.org"
    assert stat.S_IMODE((kit.workspace / LOG_FILE).stat().st_mode) == 0o600
    result = jobs(kit, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [r["decision"] for r in doc["jobs"]] == ["launched", "refused", "finished:COMPLETED"]
    text = jobs(kit).output
    assert "3 decisions of site site-a" in text and "not authorized here" in text
    assert "(lead@a.org, unverified)" in text


@pytest.mark.parametrize("tamper", ["edit", "drop"])
def test_a_line_changed_or_removed_later_breaks_the_chain(kit, tamper):
    log = JobLog(kit.workspace)
    for n in range(3):
        log.record(f"job-{n}", "alpha", "refused", None, "no")
    path = kit.workspace / LOG_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    if tamper == "edit":
        lines[1] = lines[1].replace(b'"refused"', b'"launched"')
    else:
        del lines[1]
    path.write_bytes(b"".join(lines))
    assert read_log(path).broken == (2 if tamper == "edit" else 1)
    result = jobs(kit)
    assert result.exit_code == 2
    assert "chain breaks at line" in result.output


def test_an_unwritable_log_does_not_raise(kit, caplog):
    (kit.workspace / LOG_FILE).mkdir()  # a folder in its place: open fails
    JobLog(kit.workspace).record("job-1", "alpha", "launched", SIGNED)
    assert "cannot be written" in caplog.text
