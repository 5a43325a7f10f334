"""The server's intake check of a job's signature (server/job_signing.py SubmissionCheck): it
takes a job signed by the caller, for the study it is submitted in, covering exactly the files
received, by a signer whose role may submit and who is in the study; each other case is refused
by name. Real kits, real keys, the real verifier process."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from atoll.pki.identity import Identity
from atoll.pki.job_signature import content_digest, manifest_of_tree, sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provision import ProvisionResult, provision
from atoll.server import revocation
from atoll.server.job_signing import SubmissionCheck
from atoll.server.studies import Denied
from atoll.wire.job_archive import IntakeError, zip_folder

PROJECT = "signing-check"
LEAD, OTHER, MEMBER = "lead@a.org", "other@b.org", "member@a.org"
DOC = {
    "name": PROJECT,
    "server": {"name": "server", "host": "fl.example.org", "port": 8443},
    "sites": [{"name": "site-a", "org": "a"}, {"name": "site-b", "org": "b"}],
    "users": [{"name": LEAD, "org": "a", "role": "lead"},
              {"name": OTHER, "org": "b", "role": "lead"},
              {"name": MEMBER, "org": "a", "role": "member"}],
    "studies": {"pathology": {"sites": ["site-a", "site-b"], "admins": [LEAD]}},
}


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory) -> ProvisionResult:
    return provision(parse_project(json.loads(json.dumps(DOC))),
                     tmp_path_factory.mktemp("provisioned"))


class Members:
    """Who is in which study: the server's Studies, reduced to the call SubmissionCheck makes."""

    def __init__(self, *outside: str):
        self.outside, self.asked = set(outside), []

    def require_member(self, who: Identity, study: str) -> None:
        self.asked.append((who.name, study))
        if who.name in self.outside:
            raise Denied(f"{who.name} is not in study {study}")


def identity(name: str, org: str, role: str) -> Identity:
    return Identity(name, org, "admin", role)


def signed_tree(tmp_path: Path, provisioned: ProvisionResult, signer: str,
                study: str = "pathology") -> Path:
    """A job zipped, signed by ``signer``'s own kit and unpacked, as the server receives it."""
    folder = tmp_path / "job"
    (folder / "app").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"name": "j", "deploy_map": {"app": ["@ALL"]}}))
    (folder / "app" / "train.py").write_text("print('train')\n")
    archive = tmp_path / "job.zip"
    zip_folder(folder, archive)
    sign_archive(archive, load_kit(provisioned.project_dir / signer), study)
    tree = tmp_path / "received"
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tree)
    return tree


def check(provisioned: ProvisionResult, members: Members | None = None) -> SubmissionCheck:
    return SubmissionCheck(provisioned.ca_dir / "rootCA.pem", PROJECT, members or Members())


def test_the_callers_own_signed_job_is_taken_and_its_digest_returned(tmp_path, provisioned):
    tree = signed_tree(tmp_path, provisioned, LEAD)
    members = Members()
    digest = check(provisioned, members).verify(tree, identity(LEAD, "a", "lead"), "pathology")
    # the digest of what the user signed (the folder they zipped), as the operator approves it
    assert digest == content_digest(manifest_of_tree(tmp_path / "job"))
    assert members.asked == [(LEAD, "pathology")]  # the signer's membership was asked


def test_a_job_another_user_signed_is_refused(tmp_path, provisioned):
    tree = signed_tree(tmp_path, provisioned, OTHER)
    with pytest.raises(IntakeError, match=f"signed by {OTHER} .*not by you \\({LEAD}\\)"):
        check(provisioned).verify(tree, identity(LEAD, "a", "lead"), "pathology")


def test_a_file_changed_after_signing_is_refused(tmp_path, provisioned):
    tree = signed_tree(tmp_path, provisioned, LEAD)
    (tree / "app" / "train.py").write_text("print('exfiltrate')\n")
    with pytest.raises(IntakeError, match="job refused: .*does not match.*app/train.py"):
        check(provisioned).verify(tree, identity(LEAD, "a", "lead"), "pathology")


def test_a_job_signed_for_another_study_is_refused(tmp_path, provisioned):
    tree = signed_tree(tmp_path, provisioned, LEAD, study="outcomes")
    with pytest.raises(IntakeError, match="job refused: .*outcomes"):
        check(provisioned).verify(tree, identity(LEAD, "a", "lead"), "pathology")


def test_a_member_may_not_submit_even_their_own_job(tmp_path, provisioned):
    tree = signed_tree(tmp_path, provisioned, MEMBER)
    with pytest.raises(Denied, match=f"{MEMBER} is a member; submitting jobs needs one of "):
        check(provisioned).verify(tree, identity(MEMBER, "a", "member"), "pathology")


def test_a_signer_outside_the_study_is_refused(tmp_path, provisioned):
    tree = signed_tree(tmp_path, provisioned, LEAD)
    with pytest.raises(Denied, match=f"{LEAD} is not in study pathology"):
        check(provisioned, Members(LEAD)).verify(tree, identity(LEAD, "a", "lead"), "pathology")


def test_a_job_signed_with_a_revoked_certificate_is_refused(tmp_path, provisioned, monkeypatch):
    tree = signed_tree(tmp_path, provisioned, LEAD)
    signer_pem = load_kit(provisioned.project_dir / LEAD).cert.read_bytes()
    asked = []

    def refusal(pem: bytes) -> str | None:
        asked.append(pem)
        return "this certificate is revoked (serial 2a, key-compromise)"

    monkeypatch.setattr(revocation, "refusal", refusal)
    with pytest.raises(IntakeError, match="job refused: the certificate that signed it: this "
                                          "certificate is revoked \\(serial 2a"):
        check(provisioned).verify(tree, identity(LEAD, "a", "lead"), "pathology")
    # the certificate in the job's signature was the one asked about (not only the caller's)
    assert [pem.strip() for pem in asked] == [signer_pem.strip()]
