"""The signed job travels once through a site: its meta is validated twice in all, the
document the server dispatched (to admit the job) and the signed meta.json (verified, then
handed to the unpacking and the launch request): never a third parse. An instrumentation
test: every meta validation in atoll goes through spec/meta.py's ``_validate``."""

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
def signed_zip(tmp_path) -> tuple[Path, Path, dict]:
    kits = provision(parse_project(PROJECT), tmp_path / "kits").project_dir
    job = tmp_path / "job"
    for app in ("workflow", "trainer"):
        (job / app).mkdir(parents=True)
        (job / app / "app.yaml").write_text(f"# {app}\n")
    (job / "meta.json").write_text(json.dumps(META))
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


def test_a_site_validates_the_jobs_meta_once_per_document(signed_zip, monkeypatch):
    site, site_zip, served = signed_zip
    kit = load_kit(site)
    host, link = Host(kit.local_dir, kit.workspace), Link()
    supervisor = Supervisor(kit, host=host, link=link, server=Server(site_zip),
                            tokens=WorkerTokens())
    validated = []
    original = meta_module._validate

    def counted(data, label):
        validated.append(label)
        return original(data, label)

    monkeypatch.setattr(meta_module, "_validate", counted)
    supervisor._run({"job_id": JOB_ID, "study": "alpha", "name": "two-apps", "meta": served})
    assert link.states[-1] == ("FINISHED:COMPLETED", ""), link.states
    [request] = host.launcher.requests
    assert request.name == "two-apps" and request.meta.app_for("site-a") == "trainer"
    assert (kit.workspace / "jobs" / JOB_ID / "app" / "app.yaml").read_text() == "# trainer\n"
    assert len(validated) == 2, validated  # the dispatched document, the signed meta.json
