"""A site's checks of a fetched job (site/job_acceptance.py) with real kits, real signatures and the
app zip built the way the server builds it: what was signed runs, anything else is refused with
the reason the job's status shows."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from atoll.pki.job_signature import SIGNATURE_FILE, sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from atoll.site.approvals import approve
from atoll.site.job_acceptance import JobRefused, check_job
from atoll.spec.meta import load_meta
from atoll.wire.job_archive import zip_folder

LEAD_A, LEAD_B = "lead@a.org", "lead@b.org"
PROJECT = {
    "name": "checks", "server": {"host": "127.0.0.1", "port": 8443},
    "sites": [{"name": "site-a", "org": "org-a"}],
    "users": [{"name": LEAD_A, "org": "org-a", "role": "lead"},
              {"name": LEAD_B, "org": "org-b", "role": "lead"}],
    "studies": {"alpha": {"sites": ["site-a"], "admins": [LEAD_A, LEAD_B]}},
}
META = {"name": "two-apps", "deploy_map": {"workflow": ["server"], "trainer": ["site-a"]},
        "resource_spec": {"@default": {"num_of_cpus": 1}}}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kits")
    return provision(parse_project(PROJECT), out).project_dir


@pytest.fixture
def site(project, tmp_path):
    """A fresh copy of site-a's kit: tests write its local/ files."""
    shutil.copytree(project / "site-a", tmp_path / "site-a")
    return load_kit(tmp_path / "site-a")


@pytest.fixture
def job(tmp_path) -> Path:
    folder = tmp_path / "job"
    for app in ("workflow", "trainer"):
        (folder / app).mkdir(parents=True)
        (folder / app / "app.yaml").write_text(f"# {app}\n")
    (folder / "trainer" / "train.py").write_text("print('train')\n")
    (folder / "meta.json").write_text(json.dumps(META))
    return folder


class Server:
    """What the server does with a signed upload: store it, build site-a's zip, dispatch."""

    def __init__(self, tmp: Path, job: Path, kit, study: str = "alpha"):
        tmp.mkdir(exist_ok=True)
        upload = tmp / "upload.zip"
        zip_folder(job, upload)
        sign_archive(upload, kit, study)
        self.store = tmp / "store"
        with zipfile.ZipFile(upload) as zf:
            zf.extractall(self.store)
        self.tmp, self.study, self.submitter = tmp, study, kit.name

    def body(self, **meta_changes) -> dict:
        meta = load_meta(self.store).with_server_fields(self.study, self.submitter)
        doc = {**meta.model_dump(mode="json"), **meta_changes}
        return {"job_id": "a" * 32, "study": self.study, "meta": doc}

    def fetched(self) -> Path:
        """site-a's app zip, unpacked as the site unpacks it."""
        archive, tree = self.tmp / "site.zip", self.tmp / "fetched"
        zip_folder(self.store, archive, only=["trainer", "meta.json", SIGNATURE_FILE])
        shutil.rmtree(tree, ignore_errors=True)
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tree)
        return tree


@pytest.fixture
def lead_a(project):
    return load_kit(project / LEAD_A)


def test_the_signed_job_is_accepted_with_its_signer_and_meta(site, job, lead_a, tmp_path):
    server = Server(tmp_path, job, lead_a)
    accepted = check_job(server.fetched(), server.body(), site)
    assert (accepted.signed.signer.name, accepted.signed.signer.role) == (LEAD_A, "lead")
    assert accepted.meta.resource_spec == META["resource_spec"]


@pytest.mark.parametrize(("tamper", "expected"), [
    (lambda s: (s / "trainer" / "train.py").write_text("import os\n"),
     "changed after it was signed: trainer/train.py"),
    (lambda s: (s / "trainer" / "evil.py").write_text("x\n"), "not signed: trainer/evil.py"),
    (lambda s: (s / "meta.json").write_text(json.dumps({**META, "name": "other"})),
     "changed after it was signed: meta.json"),
])
def test_a_job_changed_in_the_servers_store_is_refused(site, job, lead_a, tmp_path, tamper,
                                                       expected):
    server = Server(tmp_path, job, lead_a)
    tamper(server.store)
    with pytest.raises(JobRefused) as err:
        check_job(server.fetched(), server.body(), site)
    assert expected in str(err.value)
    assert "site-a refused the job" in str(err.value) and "nothing of it ran" in str(err.value)


def test_a_dispatch_whose_meta_differs_from_the_signed_one_is_refused(site, job, lead_a,
                                                                      tmp_path):
    server = Server(tmp_path, job, lead_a)
    body = server.body(resource_spec={"@default": {"num_of_gpus": 4}})
    with pytest.raises(JobRefused, match="differs from the signed meta.json in resource_spec"):
        check_job(server.fetched(), body, site)


def test_the_server_cannot_name_another_submitter_or_study(site, job, lead_a, tmp_path):
    server = Server(tmp_path, job, lead_a)
    with pytest.raises(JobRefused, match="names 'lead@b.org' in study 'alpha'"):
        check_job(server.fetched(), server.body(submitter=LEAD_B), site)
    body = {**server.body(), "study": "beta"}
    body["meta"]["study"] = "beta"
    with pytest.raises(JobRefused, match="signed for study 'alpha' and submitted in study 'beta'"):
        check_job(server.fetched(), body, site)


def _policy(site, **doc) -> None:
    (site.local_dir / "authorization.json").write_text(json.dumps(
        {"format_version": "1.0", "permissions": {"lead": "any"}, **doc}))


def test_a_policy_that_denies_the_role_names_its_rule(site, job, lead_a, tmp_path):
    _policy(site, permissions={"lead": {"submit_job": "none", "byoc": "any"}})
    server = Server(tmp_path, job, lead_a)
    with pytest.raises(JobRefused) as err:
        check_job(server.fetched(), server.body(), site)
    assert "refused the job by its policy (rule permissions.lead.submit_job)" in str(err.value)


def test_o_site_uses_the_org_of_the_signers_certificate(site, job, project, tmp_path):
    _policy(site, permissions={"lead": {"submit_job": "o:site", "byoc": "o:site"}})
    server = Server(tmp_path, job, load_kit(project / LEAD_B))
    with pytest.raises(JobRefused, match="lead@b.org's org 'org-b' is not this site's org "
                                         "'org-a'"):
        check_job(server.fetched(), server.body(), site)
    server = Server(tmp_path / "a", job, load_kit(project / LEAD_A))
    assert check_job(server.fetched(), server.body(), site).signed.signer.org == "org-a"


def test_per_study_rules_apply_to_that_studys_jobs(site, job, lead_a, tmp_path):
    _policy(site, studies={"alpha": {"permissions": {"lead": {"submit_job": "any"}}}})
    server = Server(tmp_path, job, lead_a)
    with pytest.raises(JobRefused, match=r"rule studies.alpha.permissions.lead\)"):
        check_job(server.fetched(), server.body(), site)  # no byoc for alpha's leads


def test_code_approval_runs_only_approved_content(site, job, lead_a, tmp_path):
    _policy(site, code_approval="required")
    server = Server(tmp_path, job, lead_a)
    with pytest.raises(JobRefused) as err:
        check_job(server.fetched(), server.body(), site)
    accepted_digest = err.value.args[0].split("this job's content ")[1].split(" ")[0]
    assert "atoll site approve <kit of site-a> JOB_DIR" in str(err.value)
    from atoll.pki.job_signature import content_digest, manifest_of_tree

    assert accepted_digest == content_digest(manifest_of_tree(job))
    approve(site.local_dir, accepted_digest, "two-apps")
    assert check_job(server.fetched(), server.body(), site).signed.digest == accepted_digest


def test_a_signer_on_the_sites_revocation_list_is_refused(site, job, lead_a, tmp_path,
                                                          monkeypatch):
    from atoll.site import revocation

    serials = []
    monkeypatch.setattr(revocation, "why",
                        lambda cert: serials.append(cert.serial_number) or "revoked in a test")
    server = Server(tmp_path, job, lead_a)
    with pytest.raises(JobRefused, match="lead@a.org that signed the job is revoked: revoked in "
                                         "a test; nothing of it ran here"):
        check_job(server.fetched(), server.body(), site)
    from cryptography import x509

    assert serials == [x509.load_pem_x509_certificate(lead_a.cert.read_bytes()).serial_number]
