"""The server worker's own check of its job (worker/signed_job.py), with real kits, a real
signature and a real CRL from `atoll provision revoke`: the job runs only when a user of the
project's CA signed exactly its meta.json and server app and is not on the CA-signed list."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.crl import Entry, build_crl
from atoll.pki.job_signature import SIGNATURE_FILE, sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from atoll.pki.revoke import revoke
from atoll.wire.job_archive import zip_folder
from atoll.worker import signed_job
from atoll.worker.signed_job import NotTrusted, keep_signed

LEAD, OTHER = "lead@a.org", "other@a.org"
PROJECT = {
    "name": "checks", "server": {"host": "127.0.0.1", "port": 8443},
    "sites": [{"name": "site-a", "org": "org-a"}],
    "users": [{"name": LEAD, "org": "org-a", "role": "lead"},
              {"name": OTHER, "org": "org-a", "role": "lead"}],
}
META = {"name": "job", "deploy_map": {"workflow": ["server"], "trainer": ["site-a"]}}


@pytest.fixture
def project(tmp_path) -> Path:
    return provision(parse_project(PROJECT), tmp_path / "kits").project_dir


def signed_workdir(tmp_path: Path, project: Path, user: str = LEAD) -> Path:
    """The server worker's run folder as the parent lays it out: app/ and signed/."""
    job = tmp_path / "job"
    for app in ("workflow", "trainer"):
        (job / app).mkdir(parents=True)
        (job / app / "app.yaml").write_text(f"# {app}\n")
    (job / "workflow" / "model.py").write_text("def make():\n    return {}\n")
    (job / "meta.json").write_text(json.dumps(META))
    upload = tmp_path / "upload.zip"
    zip_folder(job, upload)
    sign_archive(upload, load_kit(project / user), "default")
    stored = tmp_path / "stored"
    with zipfile.ZipFile(upload) as zf:
        zf.extractall(stored)
    workdir = tmp_path / "run"
    shutil.copytree(stored / "workflow", workdir / "app")
    keep_signed(stored, workdir)
    return workdir


def trust(project: Path, crl: bool = True) -> dict:
    ca = (project / "ca" / "rootCA.pem").read_text()
    held = project / "ca" / "crl.pem"
    return {"ca": ca, "crl": held.read_text() if crl and held.exists() else ""}


def test_a_job_signed_by_a_user_not_revoked_passes(tmp_path, project):
    workdir = signed_workdir(tmp_path, project)
    assert sorted(p.name for p in (workdir / "signed").iterdir()) == [SIGNATURE_FILE,
                                                                     "meta.json"]
    signed_job.check(workdir, trust(project))  # no list yet
    revoke(project, OTHER)  # a list that revokes someone else
    signed_job.check(workdir, trust(project))


def test_a_revoked_signer_is_refused_before_any_job_code(tmp_path, project):
    workdir = signed_workdir(tmp_path, project)
    revoke(project, LEAD, "key-compromise")
    with pytest.raises(NotTrusted, match=rf"refused to run the job: the certificate of {LEAD} "
                                         r"that signed the job is revoked: serial [0-9a-f]+, .*"
                                         r"reason: key-compromise \(revocation list 1\); none "
                                         "of the job's code ran"):
        signed_job.check(workdir, trust(project))


@pytest.mark.parametrize("given", [None, {}, {"ca": None}, {"ca": 7}, ["ca"], "ca"])
def test_a_parent_that_sends_no_root_ca_runs_nothing(tmp_path, project, given):
    workdir = signed_workdir(tmp_path, project)
    with pytest.raises(NotTrusted, match="its parent sent no root CA"):
        signed_job.check(workdir, given)


def test_a_list_the_projects_ca_did_not_sign_is_refused(tmp_path, project):
    workdir = signed_workdir(tmp_path, project)
    other_ca = create_ca("checks")
    forged = build_crl(other_ca, [], 99).decode()
    with pytest.raises(NotTrusted, match="revocation list was issued by|does not verify"):
        signed_job.check(workdir, {**trust(project), "crl": forged})


@pytest.mark.parametrize(("tamper", "expected"), [
    (lambda w: (w / "app" / "model.py").write_text("import os\n"),
     "changed after it was signed: workflow/model.py"),
    (lambda w: (w / "app" / "extra.py").write_text("x\n"), "not signed: workflow/extra.py"),
    (lambda w: (w / "signed" / "meta.json").write_text(json.dumps({**META, "name": "x"})),
     "changed after it was signed: meta.json"),
    (lambda w: (w / "signed" / SIGNATURE_FILE).unlink(), "the job is not signed"),
])
def test_a_job_changed_after_it_was_signed_is_refused(tmp_path, project, tamper, expected):
    workdir = signed_workdir(tmp_path, project)
    tamper(workdir)
    with pytest.raises(NotTrusted, match=expected):
        signed_job.check(workdir, trust(project))


def test_without_the_projects_ca_nothing_runs(tmp_path, project):
    workdir = signed_workdir(tmp_path, project)
    with pytest.raises(NotTrusted, match="sent no root CA"):
        signed_job.check(workdir, None)
    with pytest.raises(NotTrusted, match="this project's CA did not issue"):
        signed_job.check(workdir, {"ca": _pem(create_ca("checks")), "crl": ""})


def _pem(ca) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return ca.cert.public_bytes(Encoding.PEM).decode()


def test_an_entry_revoked_at_any_time_counts(tmp_path, project):
    """The list's own entries decide, whatever their date (a list made elsewhere by the CA)."""
    import datetime as dt

    from cryptography import x509

    from atoll.pki.ca import load_ca

    workdir = signed_workdir(tmp_path, project)
    serial = x509.load_pem_x509_certificate(
        load_kit(project / LEAD).cert.read_bytes()).serial_number
    ca = load_ca(project / "ca")
    crl = build_crl(ca, [Entry(serial, dt.datetime(2020, 1, 1, tzinfo=dt.UTC), "unspecified")],
                    7).decode()
    with pytest.raises(NotTrusted, match=r"revoked by the project admin on 2020-01-01 "
                                         r"\(revocation list 7\)"):
        signed_job.check(workdir, {**trust(project), "crl": crl})


def test_the_check_made_meanwhile_hands_its_refusal_to_the_worker(tmp_path, project):
    workdir = signed_workdir(tmp_path, project)
    assert signed_job.Checker().ask(workdir, trust(project))() is None
    revoke(project, LEAD)
    verdict = signed_job.Checker().ask(workdir, trust(project))
    with pytest.raises(NotTrusted, match=f"the certificate of {LEAD} that signed the job is "
                                         "revoked"):
        verdict()


WORKER_AT_CHECK = """
import json, sys
from pathlib import Path
from atoll.worker import signed_job
request = json.loads(sys.stdin.read())
verdict = signed_job.Checker().ask(Path(request["workdir"]), request["trust"])
try:
    verdict()
    print("trusted")
except signed_job.NotTrusted as exc:
    print("refused:", exc)
print(sorted(m for m in sys.modules if m.split(".")[0] == "cryptography"))
"""


def test_the_worker_checks_in_a_child_and_never_loads_cryptography(tmp_path, project):
    """The check's cryptography stays out of the worker, which keeps what it loads resident
    beside the model for the whole job."""
    import subprocess
    import sys

    workdir = signed_workdir(tmp_path, project)
    request = json.dumps({"workdir": str(workdir), "trust": trust(project)})

    def worker() -> list[str]:
        done = subprocess.run([sys.executable, "-P", "-c", WORKER_AT_CHECK], input=request,
                              capture_output=True, text=True, check=True)
        return done.stdout.splitlines()

    assert worker() == ["trusted", "[]"]
    (workdir / "app" / "model.py").write_text("import os\n")  # not what was signed
    refused, modules = worker()
    assert refused.startswith("refused: the server worker refused to run the job")
    assert "model.py" in refused and modules == "[]"


def test_a_check_that_ends_without_its_answer_refuses_the_job(tmp_path, project, monkeypatch):
    workdir = signed_workdir(tmp_path, project)

    def dies(*_):  # the child stops mid-check (a crash of the bindings, a kill)
        import os

        os._exit(9)

    monkeypatch.setattr(signed_job, "check", dies)
    with pytest.raises(NotTrusted, match=r"its signature check ended with code 9 \(no message\);"
                                         r" none of the job's code ran"):
        signed_job.Checker().ask(workdir, trust(project))()


def test_a_check_that_fails_otherwise_refuses_the_job_and_says_why(tmp_path, project,
                                                                   monkeypatch):
    workdir = signed_workdir(tmp_path, project)

    def breaks(*_):
        raise KeyError("ca")

    monkeypatch.setattr(signed_job, "check", breaks)
    with pytest.raises(NotTrusted, match=r"ended with code 1 \(KeyError: 'ca'\)"):
        signed_job.Checker().ask(workdir, trust(project))()


def test_a_checker_never_asked_ends_and_trusts_nothing():
    """A worker refused at registration never asks: its child ends at once, without a 0."""
    import os

    checker = signed_job.Checker()
    os.close(checker._ask)
    assert os.waitstatus_to_exitcode(os.waitpid(checker.pid, 0)[1]) == 1
