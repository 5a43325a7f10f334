"""The signed job travels once through a site: its meta is checked twice in all, the
document the server dispatched (to admit the job) and the signed meta.json (verified, then
handed to the unpacking and the launch request): never a third parse. An instrumentation
test: every check of a meta goes through spec/meta_plain.py's ``vouch_meta`` (the common
shape, in plain Python) and, for a shape it leaves to them, the models' ``_validate``
(spec/meta.py)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from atoll.launchers.base import Outcome, WorkerExit
from atoll.parent.worker_endpoint import WorkerTokens
from atoll.pki.job_signature import SIGNATURE_FILE, sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from atoll.site.supervisor import Supervisor
from atoll.spec import meta as meta_module
from atoll.spec import meta_plain
from atoll.spec.study_runtime import load_study_runtime
from atoll.wire import frames
from atoll.wire.job_archive import zip_folder

LEAD = "lead@a.org"
PROJECT = {"name": "once", "server": {"host": "127.0.0.1", "port": 8443},
           "sites": [{"name": "site-a", "org": "org-a"}],
           "users": [{"name": LEAD, "org": "org-a", "role": "lead"}],
           "studies": {"alpha": {"sites": ["site-a"], "admins": [LEAD]}}}
META = {"name": "two-apps", "deploy_map": {"workflow": ["server"], "trainer": ["site-a"]}}
JOB_ID = "a" * 32


class Server:
    """FetchJob: site-a's zip of the signed job, as the server builds it (server/app_zips.py)."""

    def __init__(self, archive: Path):
        self.archive = archive

    def FetchJob(self, request):
        yield frames.header({"job_id": request.job_id, "size": self.archive.stat().st_size})
        for chunk in frames.file_chunks(self.archive):
            yield frames.data(chunk)


class Launcher:
    name = "process"

    def __init__(self):
        self.requests = []

    def launch(self, request, on_progress=None):
        self.requests.append(request)
        return SimpleNamespace(id="h", extra={})

    def wait(self, handle):
        return WorkerExit(Outcome.COMPLETED, "")

    def cancel(self, handle):
        pass


class Host:
    def __init__(self, local: Path, workspace: Path):
        self.local, self.workspace, self.launcher = local, workspace, Launcher()

    def runs_root(self) -> Path:  # site.yaml's default: the workspace (spec/run_folders.py)
        return self.workspace

    def study_runtime(self):
        return load_study_runtime(self.local, "process")

    def capacity(self):
        return {}

    def launch_request(self, job, name, meta, token):
        return SimpleNamespace(name=name, meta=meta, resources=job.resources)

    def rejoin_to(self):
        return None  # re-attach off (the process launcher's)


class Link:
    def __init__(self):
        self.states = []

    def send_state(self, job_id, state, reason="", **extra):
        self.states.append((state, reason))


@pytest.fixture
def signed_zip(tmp_path, request) -> tuple[Path, Path, dict]:
    meta = {**META, **getattr(request, "param", {})}
    kits = provision(parse_project(PROJECT), tmp_path / "kits").project_dir
    job = tmp_path / "job"
    for app in ("workflow", "trainer"):
        (job / app).mkdir(parents=True)
        (job / app / "app.yaml").write_text(f"# {app}\n")
    (job / "meta.json").write_text(json.dumps(meta))
    upload = tmp_path / "upload.zip"
    zip_folder(job, upload)
    sign_archive(upload, load_kit(kits / LEAD), "alpha")
    store = tmp_path / "store"
    with zipfile.ZipFile(upload) as zf:
        zf.extractall(store)
    site_zip = tmp_path / "site-a.zip"
    zip_folder(store, site_zip, only=["trainer", "meta.json", SIGNATURE_FILE])
    served = {**json.loads((store / "meta.json").read_text()), "study": "alpha",
              "submitter": LEAD}
    site = tmp_path / "site-a"
    shutil.copytree(kits / "site-a", site)
    (site / "local" / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  alpha: {}\n")
    return site, site_zip, served


def _run_counted(signed_zip, monkeypatch) -> tuple[list[str], Host]:
    site, site_zip, served = signed_zip
    kit = load_kit(site)
    host, link = Host(kit.local_dir, kit.workspace), Link()
    supervisor = Supervisor(kit, host=host, link=link, server=Server(site_zip),
                            tokens=WorkerTokens())
    checks: list[str] = []
    vouch, validate = meta_plain.vouch_meta, meta_module._validate

    def vouched(data):
        meta = vouch(data)
        checks.append("plain" if meta is not None else "left to the models")
        return meta

    def validated(data, label):
        checks.append("models")
        return validate(data, label)

    monkeypatch.setattr(meta_plain, "vouch_meta", vouched)
    monkeypatch.setattr(meta_module, "_validate", validated)
    supervisor._run({"job_id": JOB_ID, "study": "alpha", "name": "two-apps", "meta": served})
    assert link.states[-1] == ("FINISHED:COMPLETED", ""), link.states
    [request] = host.launcher.requests
    assert request.name == "two-apps" and request.meta.app_for("site-a") == "trainer"
    assert (kit.workspace / "jobs" / JOB_ID / "app" / "app.yaml").read_text() == "# trainer\n"
    return checks, host


def test_a_site_checks_the_jobs_meta_once_per_document(signed_zip, monkeypatch):
    checks, _ = _run_counted(signed_zip, monkeypatch)
    # the dispatched document, the signed meta.json: a common meta needs no model at a site
    assert checks == ["plain", "plain"], checks


@pytest.mark.parametrize("signed_zip", [{"resource_spec": {"site-a": {"num_of_gpus": 0}}}],
                         indirect=True)
def test_a_meta_the_plain_check_leaves_is_validated_by_the_models_once_per_document(
        signed_zip, monkeypatch):
    checks, host = _run_counted(signed_zip, monkeypatch)
    assert checks == ["left to the models", "models"] * 2, checks
    [request] = host.launcher.requests
    assert type(request.meta).__name__ == "JobMeta"


_FRESH_SITE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from atoll.launchers.base import JobIdentity, Outcome, WorkerExit
from atoll.parent.worker_endpoint import WorkerTokens
from atoll.pki.kit import load_kit
from atoll.site.supervisor import Supervisor
from atoll.wire import frames

site, archive = Path(sys.argv[1]), Path(sys.argv[2])
served = json.loads(sys.argv[3])
kit = load_kit(site)
requests, states = [], []

class Server:
    def FetchJob(self, request):
        yield frames.header({"job_id": request.job_id, "size": archive.stat().st_size})
        for chunk in frames.file_chunks(archive):
            yield frames.data(chunk)

class Launcher:
    name = "process"
    def launch(self, request, on_progress=None):
        requests.append(request)
        return SimpleNamespace(id="h", extra={})
    def launched_image(self, handle):
        return {}
    def wait(self, handle):
        return WorkerExit(Outcome.COMPLETED, "")

class Host:  # what site/app.py's SiteParent does for a launch, on its own helpers
    launcher = Launcher()
    def runs_root(self):
        return kit.workspace
    def study_runtime(self):
        from atoll.spec.study_runtime import load_study_runtime
        return load_study_runtime(kit.local_dir, "process")
    def capacity(self):
        return {}
    def rejoin_to(self):
        return None
    def launch_request(self, job, name, meta, token):
        from atoll.launchers.request import build_request
        from atoll.site.app import _with_privacy_policy, _with_secagg_credential
        from atoll.spec.site_config import load_site_config
        request = build_request(
            meta=meta, identity=JobIdentity(job.job_id, name, job.study, kit.name, "site"),
            site_config=load_site_config(kit.local_dir / "site.yaml"), study_runtime=job.runtime,
            resources=job.resources, workdir=job.workdir, parent_address="unix:/nowhere",
            credentials={"ATOLL_JOB_TOKEN": token})
        request = _with_privacy_policy(request, kit.local_dir)
        return _with_secagg_credential(request, kit, job.job_id, job.workdir / "app")

link = SimpleNamespace(send_state=lambda job_id, state, reason="", **extra:
                       states.append((state, reason)))
Supervisor(kit, host=Host(), link=link, server=Server(), tokens=WorkerTokens())._run(
    {"job_id": "a" * 32, "study": "alpha", "name": "two-apps", "meta": served})
print(json.dumps({"states": states, "site": requests[0].identity.site,
                  "loaded": sorted(m for m in sys.modules if m in (
                      "atoll.spec.meta", "atoll.spec.launcher_spec", "atoll.spec.privacy",
                      "atoll.spec.secagg_credential"))}))
"""


def test_a_sites_first_common_job_loads_no_meta_privacy_or_launcher_spec_model(signed_zip):
    """In a fresh interpreter, as a site parent at rest takes its first job: a job whose meta
    has the common shape, at a site without local/privacy.yaml, for an app without a privacy
    section, is admitted, checked and rendered without the models of the meta, the
    launcher_spec, privacy or secure aggregation (study_runtime.yaml's and site.yaml's still
    load)."""
    import subprocess
    import sys

    site, site_zip, served = signed_zip
    run = subprocess.run([sys.executable, "-c", _FRESH_SITE, str(site), str(site_zip),
                          json.dumps(served)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.splitlines()[-1])
    assert answer["states"][-1] == ["FINISHED:COMPLETED", ""], answer
    assert answer["site"] == "site-a"
    assert answer["loaded"] == [], answer
