"""Provenance records: a chain written with the real kits' keys verifies against the project's
real CA alone, and each kind of tampering is refused naming the entry that fails."""

from __future__ import annotations

import base64
import json
import zipfile
from pathlib import Path

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.certs import issue_cert
from atoll.pki.job_signature import SIGNATURE_FILE, sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.provenance import (
    Chain,
    ProvenanceError,
    digest_of,
    entry_text,
    item_digest,
    job_signed_body,
    sign,
    site_entry,
    verify,
)
from atoll.pki.provision import ProvisionResult
from atoll.wire.job_archive import zip_folder

JOB = "3f2a9c1e-job"
AT = 1_800_000_000  # inside the provisioned certificates' validity
MODEL = digest_of(b"final model bytes")


@pytest.fixture(scope="module")
def kits(provisioned: ProvisionResult):
    d = provisioned.project_dir
    return {name: load_kit(d / name) for name in ("server", "hospital-a", "hospital-b",
                                                   "lead@hospital-a.org")}


@pytest.fixture(scope="module")
def ca(provisioned: ProvisionResult) -> bytes:
    return (provisioned.ca_dir / "rootCA.pem").read_bytes()


def keys(kit) -> tuple[bytes, bytes]:
    return kit.key.read_bytes(), kit.cert.read_bytes()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, kits) -> bytes:
    """A real signature file: a job folder zipped and signed with the lead's kit."""
    folder = tmp_path_factory.mktemp("job")
    (folder / "meta.json").write_text(json.dumps({"name": "fedavg"}))
    (folder / "train.py").write_text("print('train')\n")
    archive = folder.parent / "job.zip"
    zip_folder(folder, archive)
    sign_archive(archive, kits["lead@hospital-a.org"], "pathology", now=AT)
    with zipfile.ZipFile(archive) as zf:
        return zf.read(SIGNATURE_FILE)


def statement_of(bundle: bytes) -> str:
    return job_signed_body(bundle)["statement_digest"]


def by_site(kit, bundle: bytes, kind: str, body: dict) -> dict[str, str]:
    """What a site does: sign its entry about the job it verified, with its own key."""
    return site_entry(JOB, statement_of(bundle), kind, kit.name, body, *keys(kit), at=AT + 1)


def build(kits, bundle: bytes, *, final: bool = True) -> dict:
    server = kits["server"]
    chain = Chain("pathology-consortium", JOB)
    srv = ("server", "server")
    chain.append("job.signed", srv, job_signed_body(bundle), *keys(server), at=AT)
    chain.append("server.intake", srv, {"decision": "accepted", "atoll_version": "0.1"},
                 *keys(server), at=AT)
    for name, rule in (("hospital-a", {"approval": "sha256:ab"}), ("hospital-b", {})):
        kit = kits[name]
        chain.append_signed(by_site(kit, bundle, "site.decision",
                                    {"decision": "accepted", "rule": rule}),
                            kit.cert.read_bytes(), statement_of(bundle))
        chain.append_signed(by_site(kit, bundle, "site.launch",
                                    {"render_digest": "sha256:cd",
                                     "datasets": [{"name": "train", "mode": "ro"}]}),
                            kit.cert.read_bytes(), statement_of(bundle))
    chain.append("round.model", srv, {"round": 1, "digest": digest_of(b"r1")}, *keys(server),
                 at=AT + 10)
    if final:
        chain.append("job.final", srv, {"model_digest": MODEL, "metrics_digest": "sha256:ef",
                                        "dp_epsilon": 1.5}, *keys(server), at=AT + 11)
    return chain.record(*keys(server), at=AT + 12)


def dump(record: dict) -> bytes:
    return json.dumps(record).encode()


def edit_entry(record: dict, seq: int, **changes) -> None:
    doc = json.loads(record["entries"][seq]["entry"])
    doc.update(changes)
    record["entries"][seq]["entry"] = json.dumps(doc, sort_keys=True, separators=(",", ":"))


def test_a_complete_record_verifies_with_the_ca_and_the_model(kits, bundle, ca):
    verified = verify(dump(build(kits, bundle)), ca, MODEL)
    assert [e.kind for e in verified.entries] == [
        "job.signed", "server.intake", "site.decision", "site.launch", "site.decision",
        "site.launch", "round.model", "job.final"]
    assert [e.by_name for e in verified.entries][2:6] == ["hospital-a"] * 2 + ["hospital-b"] * 2
    assert verified.entries[0].body["submitter"] == "lead@hospital-a.org"
    assert verified.model_digest == MODEL


def test_a_changed_entry_is_named(kits, bundle, ca):
    record = build(kits, bundle)
    edit_entry(record, 3, body={"render_digest": "sha256:00", "datasets": []})
    with pytest.raises(ProvenanceError, match=r"^entry 3 \(site.launch by site hospital-a\): "
                                              "the signature of hospital-a does not match"):
        verify(dump(record), ca)


def test_one_byte_changed_anywhere_in_an_entry_is_named(kits, bundle, ca):
    record = build(kits, bundle)
    text = record["entries"][6]["entry"]
    record["entries"][6]["entry"] = text.replace('"round":1', '"round":2')
    assert record["entries"][6]["entry"] != text
    with pytest.raises(ProvenanceError, match=r"^entry 6 \(round.model by server server\)"):
        verify(dump(record), ca)


def test_reordered_entries_are_named(kits, bundle, ca):
    record = build(kits, bundle)
    record["entries"][4], record["entries"][5] = record["entries"][5], record["entries"][4]
    with pytest.raises(ProvenanceError, match=r"^entry 4 \(site.launch by site hospital-b\) "
                                              "says it is entry 5: the entries were reordered"):
        verify(dump(record), ca)


def test_a_dropped_entry_is_named(kits, bundle, ca):
    record = build(kits, bundle)
    del record["entries"][2]
    with pytest.raises(ProvenanceError, match=r"^entry 2 \(site.launch by site hospital-a\) "
                                              "says it is entry 3"):
        verify(dump(record), ca)


def test_a_record_cut_short_is_refused_by_its_head(kits, bundle, ca):
    record = build(kits, bundle)
    del record["entries"][-1]
    with pytest.raises(ProvenanceError, match="the record's head names 8 entries .* the record "
                                              "holds 7: entry 7 onwards was dropped"):
        verify(dump(record), ca)


def test_the_server_cannot_sign_an_entry_in_a_sites_name(kits, bundle, ca):
    record = build(kits, bundle, final=False)
    server = kits["server"]
    forged = site_entry(JOB, statement_of(bundle), "site.decision", "hospital-b",
                        {"decision": "accepted"}, *keys(server), at=AT)
    record["entries"].append({"seq": 7, "prev": item_digest(record["entries"][-1]), **forged})
    with pytest.raises(ProvenanceError, match=r"^entry 7 \(site.decision by site hospital-b\) "
                                              "is stated in the name of site hospital-b but "
                                              "signed by server server"):
        verify(dump(record), ca)


def test_a_site_cannot_state_a_servers_entry(kits, bundle, ca):
    with pytest.raises(ProvenanceError, match="a site cannot state a job.final entry"):
        entry_text(JOB, "job.final", ("site", "hospital-a"), AT, {}, {})
    record = build(kits, bundle)
    kit = kits["hospital-a"]
    doc = json.loads(record["entries"][7]["entry"])
    doc["by"] = {"kind": "site", "name": "hospital-a"}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    record["entries"][7] = {"seq": 7, "prev": record["entries"][7]["prev"],
                            **sign(text, *keys(kit))}
    with pytest.raises(ProvenanceError, match=r"^entry 7 \(job.final by site hospital-a\): a "
                                              "site cannot state a job.final entry"):
        verify(dump(record), ca)


def test_another_projects_ca_verifies_nothing(kits, bundle, tmp_path):
    other = create_ca("pathology-consortium")
    with pytest.raises(ProvenanceError, match=r"^entry 0 \(job.signed by server server\) is "
                                              "signed with a certificate this project's CA "
                                              "did not issue"):
        verify(dump(build(kits, bundle)), other.cert_pem())


def test_a_wrong_model_file_is_named(kits, bundle, ca):
    with pytest.raises(ProvenanceError, match=r"^entry 7 \(job.final by server server\): the "
                                              "model file's digest sha256:.* is not the final"):
        verify(dump(build(kits, bundle)), ca, digest_of(b"final model bytez"))


def test_a_changed_job_signature_in_the_first_entry_is_named(kits, bundle, ca):
    doc = json.loads(bundle)
    statement = json.loads(doc["statement"])
    statement["files"]["train.py"] = "0" * 64
    doc["statement"] = json.dumps(statement, sort_keys=True, separators=(",", ":"))
    server = kits["server"]
    chain = Chain("pathology-consortium", JOB)
    body = job_signed_body(json.dumps(doc).encode())  # re-signed by the server: link intact
    chain.append("job.signed", ("server", "server"), body, *keys(server), at=AT)
    with pytest.raises(ProvenanceError, match=r"^entry 0 \(job.signed by server server\): the "
                                              "submitter's job signature does not verify"):
        verify(dump(chain.record(*keys(server), at=AT)), ca)


def test_a_certificate_of_another_ca_under_a_sites_name_is_refused(kits, bundle, ca, tmp_path):
    record = build(kits, bundle, final=False)
    impostor = issue_cert(create_ca("pathology-consortium"), "hospital-b", "hospital-b", "site")
    impostor.write(tmp_path / "c.crt", tmp_path / "c.key")
    item = site_entry(JOB, statement_of(bundle), "site.note", "hospital-b",
                      {"data_fingerprint": "sha256:aa"}, (tmp_path / "c.key").read_bytes(),
                      (tmp_path / "c.crt").read_bytes(), at=AT)
    record["entries"].append({"seq": 7, "prev": item_digest(record["entries"][-1]), **item})
    record["certificates"][item["signer"]] = (tmp_path / "c.crt").read_text()
    with pytest.raises(ProvenanceError, match=r"^entry 7 \(site.note by site hospital-b\) is "
                                              "signed with a certificate this project's CA did "
                                              "not issue"):
        verify(dump(record), ca)


def test_a_forged_signature_value_is_named(kits, bundle, ca):
    record = build(kits, bundle)
    sig = bytearray(base64.b64decode(record["entries"][1]["signature"]))
    sig[-1] ^= 1
    record["entries"][1]["signature"] = base64.b64encode(bytes(sig)).decode()
    with pytest.raises(ProvenanceError, match=r"^entry 1 \(server.intake by server server\)"):
        verify(dump(record), ca)


def test_a_site_entry_about_another_submission_is_not_appended(kits, bundle):
    chain = Chain("pathology-consortium", JOB)
    chain.append("job.signed", ("server", "server"), job_signed_body(bundle),
                 *keys(kits["server"]), at=AT)
    kit = kits["hospital-a"]
    other = site_entry(JOB, "sha256:" + "0" * 64, "site.decision", kit.name, {}, *keys(kit),
                       at=AT)
    with pytest.raises(ProvenanceError, match="is not about job"):
        chain.append_signed(other, kit.cert.read_bytes(), statement_of(bundle))
    assert chain.next_seq == 1


def test_a_site_entry_moved_into_another_submissions_record_is_named(kits, bundle, ca):
    record = build(kits, bundle, final=False)
    kit = kits["hospital-b"]
    stale = site_entry(JOB, "sha256:" + "1" * 64, "site.launch", kit.name, {}, *keys(kit),
                       at=AT)  # signed for an earlier submission under the same id
    record["entries"].append({"seq": 7, "prev": item_digest(record["entries"][-1]), **stale})
    with pytest.raises(ProvenanceError, match=r"^entry 7 \(site.launch by site hospital-b\) is "
                                              "about another submission"):
        verify(dump(record), ca)


def test_a_changed_link_of_a_site_entry_breaks_the_next_one(kits, bundle, ca):
    record = build(kits, bundle)
    record["entries"][3]["prev"] = "sha256:" + "0" * 64
    with pytest.raises(ProvenanceError, match=r"^entry 3 \(site.launch by site hospital-a\) "
                                              "does not link"):
        verify(dump(record), ca)


def test_a_malformed_record_is_refused_plainly(ca):
    with pytest.raises(ProvenanceError, match="malformed"):
        verify(b"{not json", ca)
    with pytest.raises(ProvenanceError, match="is not atoll-provenance/1"):
        verify(b'{"format": "x"}', ca)


def test_verification_reads_the_record_as_bytes_only(kits, bundle, ca, tmp_path: Path):
    path = tmp_path / "record.json"
    path.write_bytes(dump(build(kits, bundle)))
    assert verify(path.read_bytes(), ca).job_id == JOB


# -- the command an auditor runs ------------------------------------------------------------
def run_verify(*args):
    from click.testing import CliRunner

    from atoll.cli.main import cli

    return CliRunner().invoke(cli, ["provenance", "verify", *map(str, args)])


def test_the_verify_command_checks_a_record_and_a_model_file(kits, bundle, ca, tmp_path,
                                                             provisioned):
    record = build(kits, bundle)
    final = json.loads(record["entries"][7]["entry"])["body"]["model_digest"]
    model = tmp_path / "global_model_final.safetensors"
    model.write_bytes(b"final model bytes")
    assert final == MODEL
    path = tmp_path / "provenance.json"
    path.write_bytes(dump(record))
    ca_file = provisioned.ca_dir / "rootCA.pem"
    result = run_verify(path, "--ca", ca_file, "--model", model)
    assert result.exit_code == 0, result.output
    assert "8 entries verify" in result.output and "is the final model" in result.output
    model.write_bytes(b"final model bytes!")
    result = run_verify(path, "--ca", ca_file, "--model", model)
    assert result.exit_code == 2
    assert "entry 7 (job.final by server server): the model file's digest" in result.output


def test_the_verify_command_exits_2_naming_a_tampered_entry(kits, bundle, tmp_path,
                                                            provisioned):
    data = dump(build(kits, bundle)).replace(b"hospital-b", b"hospital-c", 1)
    path = tmp_path / "provenance.json"
    path.write_bytes(data)
    result = run_verify(path, "--ca", provisioned.ca_dir / "rootCA.pem", "--format", "json")
    assert result.exit_code == 2
    error = json.loads(result.output)["error"]
    assert error["code"] == "INVALID" and error["message"].startswith("entry 4 (site.decision")


def test_a_repeated_site_entry_is_named(kits, bundle, ca):
    record = build(kits, bundle, final=False)
    copy = {k: record["entries"][2][k] for k in ("entry", "signature", "signer")}
    record["entries"].append({"seq": 7, "prev": item_digest(record["entries"][-1]), **copy})
    with pytest.raises(ProvenanceError, match=r"^entry 7 \(site.decision by site hospital-a\) "
                                              "repeats entry 2"):
        verify(dump(record), ca)
