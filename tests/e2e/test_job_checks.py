"""Wrong turns 2 and 5: a job that cannot run was accepted, launched workers and failed 1-2 s
later, or waited silently forever. Now `atoll job validate` and `job submit` refuse it on the
user's machine, naming the user's own paths, once each, with exit 2; what can only fail at run
time names job-relative paths, once, and every site shows its own reason."""

from __future__ import annotations

import json

import pytest

from tests.e2e.newcomer import cli  # noqa: F401 - the fixture


@pytest.fixture
def poc(cli):  # noqa: F811
    cli("poc", "up", "--sites", "2")
    return cli


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


MISTAKES = {
    "no_app_yaml": (lambda job: (job / "app" / "app.yaml").unlink(),
                    "myjob/app/app.yaml: missing: every app folder needs an app.yaml"),
    "workflow_typo": (lambda job: _edit(job / "app" / "app.yaml", "fedavg", "fedavgg"),
                      "myjob/app/app.yaml: server.workflow: "),
    "arg_typo": (lambda job: _edit(job / "app" / "app.yaml", "num_rounds", "num_round"),
                 "myjob/app/app.yaml: server.args.num_round: unknown key"),
    "no_train_py": (lambda job: (job / "app" / "train.py").unlink(),
                    "myjob/app/app.yaml: site.script: 'train.py' is not a file in myjob/app/"),
    "syntax_error": (lambda job: _edit(job / "app" / "train.py", "import", "imprt"),
                     "myjob/app/train.py: line "),
    "min_clients": (lambda job: _edit(job / "meta.json", '"min_clients": 2', '"min_clients": 3'),
                    "myjob/meta.json: min_clients: 3, but the job can reach only 2 site(s)"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_job_that_cannot_run_is_refused_before_it_is_sent(poc, mistake):
    poc("job", "init", "myjob")
    make, expected = MISTAKES[mistake]
    make(poc.cwd / "myjob")
    for command in (("job", "validate", "myjob"), ("job", "submit", "myjob", "--wait")):
        refused = poc(*command, check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert expected in refused.stderr
        assert refused.stderr.count(expected) == 1
        assert str(poc.cwd) not in refused.stderr  # the user's own paths, not absolute ones
    assert poc.json("job", "list") == []  # nothing was sent


def test_a_one_site_federation_refuses_the_template_that_needs_two(cli):  # noqa: F811
    cli("poc", "up", "--sites", "1")
    cli("job", "init", "myjob")
    # job init now writes the study's own site count; a job that asks for more is refused
    meta = cli.cwd / "myjob" / "meta.json"
    assert json.loads(meta.read_text())["min_clients"] == 1
    meta.write_text(meta.read_text().replace('"min_clients": 1', '"min_clients": 2'))
    refused = cli("job", "submit", "myjob", "--wait", check=False)
    assert refused.returncode == 2
    assert "min_clients: 2, but the job can reach only 1 site(s)" in refused.stderr


def test_the_server_refuses_what_could_never_start_from_the_python_api(poc):
    poc("job", "init", "myjob")
    _edit(poc.cwd / "myjob" / "meta.json", '"min_clients": 2', '"min_clients": 3')
    code = ("import sys, atoll\n"
            "from atoll.admin.errors import Refused\n"
            "with atoll.Session(sys.argv[1]) as s:\n"
            "    try:\n        s.submit('myjob', study='default')\n"
            "    except Refused as exc:\n        print(exc)\n")
    kit = poc.workspace / "poc" / "admin@poc.local"
    out = _python(poc, code, str(kit))
    assert "min_clients: 3, but the job can reach only 2 site(s)" in out
    assert poc.json("job", "list") == []


def test_wait_says_what_the_job_waits_for(poc):
    poc("job", "init", "myjob")
    stop = poc.workspace / "poc" / "site-2"
    from atoll.parent import detach

    detach.stop(stop / "workspace", "site")
    for _ in range(300):  # until the server has seen it go (a condition, not a time)
        if not {s["name"]: s["online"] for s in poc.json("site", "list")["sites"]}["site-2"]:
            break
    waiting = poc("job", "submit", "myjob", "--wait", "--timeout", "3", check=False)
    assert "waiting for sites: 1 of 2 online, 2 needed (min_clients)" in waiting.stdout


def test_run_time_failures_name_job_paths_once_per_site(poc):
    """A site script that fails at run time: each site shows its own reason, once, with no
    class path and no path of the machine that ran it."""
    poc("job", "init", "myjob")
    train = poc.cwd / "myjob" / "app" / "train.py"
    train.write_text("import atoll.client as fl\nfl.init()\n"
                     "raise RuntimeError(f'no data at {fl.site_name()}')\n")
    done = poc("job", "submit", "myjob", "--wait", check=False)
    assert done.returncode == 1
    job = poc.json("job", "list")[0]
    status = poc("job", "status", job["job_id"]).stdout
    for site in ("site-1", "site-2"):
        own = f"RuntimeError: no data at {site}"
        assert status.count(own) == 1 and done.stdout.count(own) <= 1
    assert "atoll.fl." not in status and "/workspace/" not in status
    parts = json.loads(poc("job", "status", job["job_id"], "--format", "json").stdout)["parts"]
    site_reasons = [parts[s]["reason"] for s in ("site-1", "site-2")]
    assert len(set(site_reasons)) == 2  # every site its own reason, not a copy of another's


def _python(cli, code: str, *args: str) -> str:  # noqa: F811
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code, *args], env=cli.env, cwd=cli.cwd,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_set_overrides_app_yaml_for_one_submission(poc):
    poc("job", "init", "myjob")
    typo = poc("job", "submit", "myjob", "--set", "num_round=2", check=False)
    assert typo.returncode == 2 and "--set: server.args.num_round: unknown key" in typo.stderr
    ran = poc("job", "submit", "myjob", "--set", "num_rounds=2", "--wait")
    assert "round 2:" in ran.stdout and "round 3:" not in ran.stdout
    assert "num_rounds: 5" in (poc.cwd / "myjob" / "app" / "app.yaml").read_text()  # unchanged


def test_validate_without_a_kit_checks_the_folder_and_says_what_it_did_not(cli):  # noqa: F811
    cli("job", "init", "myjob")
    ok = cli("job", "validate", "myjob")
    assert "myjob: ok" in ok.stdout and "not checked against a study" in ok.stdout


def test_a_job_asking_more_than_an_online_site_has_is_refused_at_submit(poc):
    """Wrong turn 5, resources: a site reports what it can ever hold (local/site.yaml's
    capacity); a job asking more there would wait forever. The server refuses it at submit."""
    site_yaml = poc.workspace / "poc" / "site-1" / "local" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text() + "\ncapacity: {gpus: 1}\n")
    poc("poc", "down")
    poc("poc", "up")  # the same federation; site-1 now reports its capacity
    poc("job", "init", "myjob")
    meta = poc.cwd / "myjob" / "meta.json"
    doc = json.loads(meta.read_text())
    doc["resource_spec"] = {"@default": {"num_of_gpus": 2}}
    meta.write_text(json.dumps(doc))
    refused = poc("job", "submit", "myjob", "--wait", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ("resource_spec: site 'site-1' could never run this job: 2 GPU(s) asked, 1 free "
            "with nothing else running there") in refused.stderr
    assert "site-2" not in refused.stderr  # no limit there: it could
    assert poc.json("job", "list") == []

    doc["resource_spec"] = {"@default": {"num_of_gpus": 2}, "site-1": {"num_of_gpus": 1}}
    meta.write_text(json.dumps(doc))
    accepted = poc.json("job", "submit", "myjob")  # asks what site-1 has: it may run
    assert accepted["job_id"]
    poc("job", "abort", accepted["job_id"])
