"""Signed jobs: a job signed with a real kit's key verifies against the project's real CA, and
every change to what was signed, every foreign or wrong certificate, is refused by name."""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from atoll.pki.ca import create_ca, load_ca
from atoll.pki.certs import issue_cert
from atoll.pki.job_signature import (
    SIGNATURE_FILE,
    SignatureError,
    content_digest,
    manifest_of_tree,
    sign_archive,
    verify_job_tree,
)
from atoll.pki.kit import load_kit
from atoll.pki.provision import ProvisionResult
from atoll.wire.job_archive import zip_folder

PROJECT, LEAD = "pathology-consortium", "lead@hospital-a.org"
META = {"name": "fedavg", "deploy_map": {"app": ["@ALL"]},
        "resource_spec": {"@default": {"num_of_cpus": 1}}}


@pytest.fixture
def job(tmp_path: Path) -> Path:
    folder = tmp_path / "job"
    (folder / "app" / "custom").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(META))
    (folder / "app" / "app.yaml").write_text("site: {script: train.py}\n")
    (folder / "app" / "train.py").write_text("print('train')\n")
    (folder / "app" / "custom" / "net.py").write_text("NET = 1\n")
    return folder


def signed_tree(job: Path, kit, study: str = "pathology") -> Path:
    """Zip, sign and unpack the job as the server receives it."""
    archive = job.parent / "job.zip"
    zip_folder(job, archive)
    sign_archive(archive, kit, study)
    tree = job.parent / "received"
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tree)
    return tree


def verify(tree: Path, ca_pem: Path, study: str = "pathology"):
    return verify_job_tree(tree, ca_pem, PROJECT, study)


@pytest.fixture
def lead(provisioned: ProvisionResult):
    return load_kit(provisioned.project_dir / LEAD)


@pytest.fixture
def ca_pem(provisioned: ProvisionResult) -> Path:
    """The project's root CA file, as in every kit (the verifier runs in its own process)."""
    return provisioned.ca_dir / "rootCA.pem"


def test_a_signed_job_verifies_and_names_its_signer_from_the_certificate(job, lead, ca_pem):
    signed = verify(signed_tree(job, lead), ca_pem)
    assert (signed.signer.name, signed.signer.org, signed.signer.role) == (
        LEAD, "hospital-a", "lead")
    assert (signed.statement.project, signed.statement.study) == (PROJECT, "pathology")
    assert set(signed.statement.files) == {"meta.json", "app/app.yaml", "app/train.py",
                                           "app/custom/net.py"}
    # the digest an operator approves from the folder is the one the signature covers
    assert signed.digest == content_digest(manifest_of_tree(job)) == signed.statement.digest


@pytest.mark.parametrize(("change", "expected"), [
    (lambda t: (t / "app" / "train.py").write_text("import os; os.system('x')\n"),
     "changed after it was signed: app/train.py"),
    (lambda t: (t / "meta.json").write_text(json.dumps(
        {**META, "resource_spec": {"@default": {"num_of_gpus": 8}}})),
     "changed after it was signed: meta.json"),
    (lambda t: (t / "app" / "extra.py").write_text("x = 1\n"), "not signed: app/extra.py"),
    (lambda t: (t / "app" / "custom" / "net.py").unlink(),
     "signed but missing: app/custom/net.py"),
])
def test_any_change_to_the_content_is_refused_by_name(job, lead, ca_pem, change, expected):
    tree = signed_tree(job, lead)
    change(tree)
    with pytest.raises(SignatureError, match=expected):
        verify(tree, ca_pem)


def test_a_changed_statement_breaks_the_signature(job, lead, ca_pem):
    tree = signed_tree(job, lead)
    bundle = json.loads((tree / SIGNATURE_FILE).read_text())
    bundle["statement"] = bundle["statement"].replace('"pathology"', '"outcomes"')
    (tree / SIGNATURE_FILE).write_text(json.dumps(bundle))
    with pytest.raises(SignatureError, match="statement was changed after it was signed"):
        verify(tree, ca_pem, "outcomes")


def test_a_job_cannot_be_replayed_into_another_study(job, lead, ca_pem):
    with pytest.raises(SignatureError, match="signed for study 'pathology' and submitted in "
                                             "study 'outcomes'"):
        verify(signed_tree(job, lead), ca_pem, "outcomes")


def test_an_unsigned_job_is_refused_with_what_to_do(job, ca_pem):
    with pytest.raises(SignatureError, match=r"not signed .*atoll job submit"):
        verify(job, ca_pem)


def _kit_of(tmp_path: Path, issued, name: str) -> SimpleNamespace:
    issued.write(tmp_path / "c.crt", tmp_path / "c.key")
    return SimpleNamespace(project=PROJECT, name=name, cert=tmp_path / "c.crt",
                           key=tmp_path / "c.key")


def test_a_certificate_of_another_ca_is_refused(job, tmp_path, ca_pem):
    issued = issue_cert(create_ca(PROJECT), LEAD, "hospital-a", "admin", "lead")
    with pytest.raises(SignatureError, match="this project's CA did not issue"):
        verify(signed_tree(job, _kit_of(tmp_path, issued, LEAD)), ca_pem)


def test_a_site_certificate_cannot_sign_jobs(job, tmp_path, provisioned, ca_pem):
    issued = issue_cert(load_ca(provisioned.ca_dir), "hospital-a", "hospital-a", "site")
    with pytest.raises(SignatureError, match="only users .admin kits. sign jobs"):
        verify(signed_tree(job, _kit_of(tmp_path, issued, "hospital-a")), ca_pem)


def test_an_expired_certificate_is_refused(job, tmp_path, provisioned, ca_pem):
    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    issued = issue_cert(load_ca(provisioned.ca_dir), LEAD, "hospital-a", "admin", "lead",
                        not_before=start, not_after=start + dt.timedelta(days=1))
    with pytest.raises(SignatureError, match="is not valid now"):
        verify(signed_tree(job, _kit_of(tmp_path, issued, LEAD)), ca_pem)


def test_a_statement_naming_someone_else_is_refused(job, tmp_path, provisioned, ca_pem):
    issued = issue_cert(load_ca(provisioned.ca_dir), LEAD, "hospital-a", "admin", "lead")
    with pytest.raises(SignatureError, match="names 'admin@consortium.org' as its submitter"):
        verify(signed_tree(job, _kit_of(tmp_path, issued, "admin@consortium.org")), ca_pem)


def test_a_revoked_certificate_is_refused_when_revocation_is_known(job, lead, ca_pem):
    from atoll.pki.job_signature import read_bundle, verify_bundle

    tree = signed_tree(job, lead)
    with pytest.raises(SignatureError, match="is revoked: key lost"):
        verify_bundle(read_bundle(tree), ca_pem.read_bytes(), revoked=lambda cert: "key lost")


def test_the_signature_file_name_is_reserved(job, lead):
    (job / SIGNATURE_FILE).write_text("{}")
    with pytest.raises(SignatureError, match="reserved for the job's signature"):
        signed_tree(job, lead)


def test_a_link_in_a_job_folder_is_refused_when_listing_it(job, tmp_path):
    (job / "app" / "data").symlink_to("/etc")
    with pytest.raises(SignatureError, match="app/data is not a regular file"):
        manifest_of_tree(job)


def test_each_signing_is_a_statement_of_its_own(job, lead, ca_pem, tmp_path):
    """The same folder signed twice in the same second: one content, two statements (a site
    refuses a statement under a second job id: site/signed_jobs.py)."""
    first, second = tmp_path / "a.zip", tmp_path / "b.zip"
    for archive in (first, second):
        zip_folder(job, archive)
        sign_archive(archive, lead, "pathology", now=1_800_000_000)
    signed = []
    for archive in (first, second):
        tree = tmp_path / archive.stem
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tree)
        signed.append(verify(tree, ca_pem))
    assert signed[0].digest == signed[1].digest  # what a code approval names
    assert signed[0].statement.nonce != signed[1].statement.nonce
    assert len(signed[0].statement.nonce) == 32
    assert signed[0].statement_digest != signed[1].statement_digest
    assert signed[0].statement_digest.startswith("sha256:")


def test_a_signature_from_before_the_nonce_still_verifies(job, lead, ca_pem, tmp_path):
    import base64

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from atoll.pki.job_signature import FORMAT, canonical

    text = canonical({"format": FORMAT, "project": PROJECT, "study": "pathology",
                      "submitter": LEAD, "signed_at": 1_800_000_000,
                      "files": manifest_of_tree(job)})
    key = serialization.load_pem_private_key(lead.key.read_bytes(), password=None)
    (job / SIGNATURE_FILE).write_text(json.dumps({
        "format": FORMAT, "statement": text.decode(), "certificate": lead.cert.read_text(),
        "signature": base64.b64encode(key.sign(text, ec.ECDSA(hashes.SHA256()))).decode()}))
    signed = verify(job, ca_pem)
    assert signed.statement.nonce == ""
    assert signed.statement_digest.startswith("sha256:")
