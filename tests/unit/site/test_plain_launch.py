"""A site parent at rest launches its first common job with no model loaded: study_runtime.yaml
as the check of local/ accepted it (plain values), the process launcher from the check's
values, the request asking site.yaml nothing more. An edited study_runtime.yaml goes through the
models, and so does a job whose meta has a launcher_spec."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atoll.parent.local_config import load_local_config
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision

LEAD = "lead@a.org"
PROJECT = {"name": "plain", "server": {"host": "127.0.0.1", "port": 8443},
           "sites": [{"name": "site-a", "org": "org-a"}],
           "users": [{"name": LEAD, "org": "org-a", "role": "lead"}],
           "studies": {"alpha": {"sites": ["site-a"], "admins": [LEAD]}}}

_FRESH = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from atoll.parent.local_config import load_local_config
from atoll.pki.kit import load_kit
from atoll.site.app import SiteParent
from atoll.spec.admission import asked_at
from atoll.spec.meta_plain import read_meta

kit, workdir, meta = load_kit(Path(sys.argv[1])), Path(sys.argv[2]), read_meta(sys.argv[3].encode())
parent = SiteParent.__new__(SiteParent)  # what a launch uses of a started site parent
parent.kit, parent.name, parent.workspace = kit, kit.name, kit.workspace
parent.local = load_local_config(kit.local_dir, True, kit.workspace)
parent.worker_address = "unix:/nowhere"
parent._endpoint = SimpleNamespace(cert_pem=None, socket_path="/nowhere")
if sys.argv[4] == "edit":  # an operator's edit while the parent runs
    parent.local.launcher_name  # the start's check is done
    with open(kit.local_dir / "study_runtime.yaml", "a") as f:
        f.write("# edited after the start" + chr(10))
runtime = parent.study_runtime()
entry = runtime.entry("alpha")
job = SimpleNamespace(job_id="a" * 32, study="alpha", runtime=runtime, entry=entry,
                      resources=asked_at(meta, kit.name, "process"), workdir=workdir)
request = parent.launch_request(job, "j", meta, "token")
print(json.dumps({"pydantic": "pydantic" in sys.modules,
                  "runtime": type(runtime).__name__,
                  "site_config": type(request.site_config).__name__,
                  "kit_dir": str(request.site_config.kit_dir),
                  "datasets": {n: [d.source, d.mode] for n, d in request.study_runtime.datasets.items()},
                  "env": dict(request.study_runtime.env),
                  "launcher": parent.launcher.name}))
parent.local.close()
"""

RUNTIME = "format_version: 2\nstudies:\n  alpha:\n    datasets: {{slides: {{source: {data}, mode: ro}}}}\n    env: {{LOG_LEVEL: debug}}\n"
COMMON = {"name": "j", "deploy_map": {"app": ["@ALL"]}}


def _site(tmp_path):
    kits = provision(parse_project(PROJECT), tmp_path / "kits").project_dir
    site = kits / "site-a"
    data = tmp_path / "data"
    data.mkdir()
    (site / "local" / "study_runtime.yaml").write_text(RUNTIME.format(data=data))
    kit = load_kit(site)
    load_local_config(kit.local_dir, True, kit.workspace).close()  # the start's check, recorded
    workdir = tmp_path / "run"
    (workdir / "app").mkdir(parents=True)
    (workdir / "app" / "app.yaml").write_text("site: {script: train.py}\n")
    return site, workdir, data


def _launch(site, workdir, meta, edit=False):
    run = subprocess.run([sys.executable, "-c", _FRESH, str(site), str(workdir),
                          json.dumps(meta), "edit" if edit else "-"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_a_sites_first_common_job_is_launched_without_a_model(tmp_path):
    site, workdir, data = _site(tmp_path)
    answer = _launch(site, workdir, COMMON)
    assert answer == {"pydantic": False, "runtime": "PlainStudyRuntime",
                      "site_config": "ProcessSite", "kit_dir": str(site.resolve()),
                      "datasets": {"slides": [str(data), "ro"]}, "env": {"LOG_LEVEL": "debug"},
                      "launcher": "process"}


@pytest.mark.parametrize("change", ["edited study_runtime.yaml", "a launcher_spec"])
def test_otherwise_the_models_read_it(tmp_path, change):
    site, workdir, data = _site(tmp_path)
    meta = COMMON
    if change == "a launcher_spec":
        meta = {**COMMON, "launcher_spec": {"site-a": {"process": {}}}}
    answer = _launch(site, workdir, meta, edit=change.startswith("edited"))
    assert answer["pydantic"] is True
    assert answer["site_config"] == "SiteConfig"
    assert answer["runtime"] == ("StudyRuntime" if change.startswith("edited")
                                 else "PlainStudyRuntime")
    assert answer["datasets"] == {"slides": [str(data), "ro"]}
    assert answer["env"] == {"LOG_LEVEL": "debug"}
    assert answer["kit_dir"] == str(site.resolve())
