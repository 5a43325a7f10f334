"""The server's side of a job's record (server/provenance.py), with real kits: its own entries
signed with the server's key, a site's entries appended verbatim only in that site's name, and
a restarted server (a resumed job) continuing the same chain."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from atoll.pki.job_signature import SIGNATURE_FILE, sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.project import parse_project
from atoll.pki.provenance import ProvenanceError, item_digest, site_entry, verify
from atoll.pki.provision import provision
from atoll.server.provenance import ITEMS_FILE, ServerProvenance
from atoll.wire.job_archive import zip_folder

PROJECT = {"name": "prov", "server": {"host": "127.0.0.1", "port": 8443},
           "sites": [{"name": "site-a", "org": "org-a"}, {"name": "site-b", "org": "org-b"}],
           "users": [{"name": "lead@a.org", "org": "org-a", "role": "lead"}],
           "studies": {"alpha": {"sites": ["site-a", "site-b"], "admins": ["lead@a.org"]}}}
JOB = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    root = provision(parse_project(PROJECT), tmp_path_factory.mktemp("kits")).project_dir
    return {n: load_kit(root / n) for n in ("server", "site-a", "site-b", "lead@a.org")}


@pytest.fixture
def jobs_dir(tmp_path, kits) -> Path:
    """A job as intake keeps it: its files and the submitter's signature."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "meta.json").write_text(json.dumps({"name": "j"}))
    zip_folder(src, tmp_path / "job.zip")
    sign_archive(tmp_path / "job.zip", kits["lead@a.org"], "alpha")
    with zipfile.ZipFile(tmp_path / "job.zip") as zf:
        zf.extractall(tmp_path / "jobs" / JOB / "job")
    return tmp_path / "jobs"


@pytest.fixture(autouse=True, params=["in the parent", "by its verifier"])
def where(request, monkeypatch):
    """Each test twice: signing and the check of a site's entry made in this process, and as a
    parent does, by its verifier process (pki/verifier.py), never answered here."""
    from atoll.pki import provenance, verifier

    monkeypatch.setattr(verifier, "_PARENTS", None)
    if request.param == "in the parent":
        yield request.param
        return

    def not_here(*args, **kwargs):
        raise AssertionError("answered in the parent, not by its verifier")

    verifier.prestart()
    monkeypatch.setattr(provenance, "signature_here", not_here)
    monkeypatch.setattr(provenance, "check_site_item_here", not_here)
    try:
        yield request.param
    finally:
        verifier._PARENTS._drop()


def statement(jobs_dir: Path) -> str:
    from atoll.pki.provenance import job_signed_body

    return job_signed_body((jobs_dir / JOB / "job" / SIGNATURE_FILE).read_bytes())[
        "statement_digest"]


def report(kit, jobs_dir, signer=None, kind="site.decision") -> dict:
    key_kit = signer or kit
    item = site_entry(JOB, statement(jobs_dir), kind, kit.name, {"decision": "accepted"},
                      key_kit.key.read_bytes(), key_kit.cert.read_bytes(), at=1_800_000_000)
    return {"provenance": [item], "certificate": key_kit.cert.read_text()}


def test_a_job_record_verifies_and_continues_after_a_restart(kits, jobs_dir):
    ca = kits["server"].ca.read_bytes()
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    prov.site_items(JOB, "site-a", report(kits["site-a"], jobs_dir))
    again = ServerProvenance(kits["server"], jobs_dir, "9.9")  # a restarted server
    again.site_items(JOB, "site-b", report(kits["site-b"], jobs_dir))
    again.finished(JOB, "COMPLETED", "")
    verified = verify(again.export(JOB), ca)
    assert [(e.kind, e.by_name) for e in verified.entries] == [
        ("job.signed", "server"), ("server.intake", "server"), ("site.decision", "site-a"),
        ("site.decision", "site-b"), ("job.final", "server")]
    assert verified.entries[1].body["atoll_version"] == "9.9"
    assert len((jobs_dir / JOB / ITEMS_FILE).read_bytes().splitlines()) == 5


def test_an_entry_in_another_sites_name_is_left_out(kits, jobs_dir, caplog):
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    prov.site_items(JOB, "site-a", report(kits["site-b"], jobs_dir))  # site-a sends site-b's
    assert "not in site-a's own name" in caplog.text
    record = prov.export(JOB)
    assert len(json.loads(record)["entries"]) == 2


def test_an_entry_the_server_signed_in_a_sites_name_fails_verification(kits, jobs_dir):
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    record = json.loads(prov.export(JOB))
    # whoever holds the server's key writes a site.decision for site-a into the record
    item = report(kits["site-a"], jobs_dir, signer=kits["server"])["provenance"][0]
    record["entries"].append({"seq": 2, "prev": item_digest(record["entries"][-1]), **item})
    with pytest.raises(ProvenanceError, match=r"^entry 2 \(site.decision by site site-a\) is "
                                              "stated in the name of site site-a but signed by "
                                              "server server"):
        verify(json.dumps(record).encode(), kits["server"].ca.read_bytes())


@pytest.mark.parametrize("bad", ["server key", "server kind", "other submission", "repeated",
                                 "too many"])
def test_a_site_entry_that_would_not_verify_is_left_out(kits, jobs_dir, caplog, bad):
    """No site can make the record fail for everyone: what would fail is not appended."""
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    site = kits["site-a"]
    if bad == "server key":
        body = report(site, jobs_dir, signer=kits["server"])
    elif bad == "server kind":  # a site's own key, on a kind only the server states
        text = json.loads(report(site, jobs_dir)["provenance"][0]["entry"])
        text["kind"] = "job.final"
        from atoll.pki.provenance import sign

        item = sign(json.dumps(text, sort_keys=True, separators=(",", ":")).encode(),
                    site.key.read_bytes(), site.cert.read_bytes())
        body = {"provenance": [item], "certificate": site.cert.read_text()}
    elif bad == "other submission":
        item = site_entry(JOB, "sha256:" + "0" * 64, "site.decision", "site-a", {},
                          site.key.read_bytes(), site.cert.read_bytes(), at=1_800_000_000)
        body = {"provenance": [item], "certificate": site.cert.read_text()}
    elif bad == "repeated":
        body = report(site, jobs_dir)
        prov.site_items(JOB, "site-a", body)  # the first is kept
    else:  # 17 entries of its own, in two reports
        items = [site_entry(JOB, statement(jobs_dir), "site.note", "site-a", {"n": n},
                            site.key.read_bytes(), site.cert.read_bytes(), at=1_800_000_000)
                 for n in range(17)]
        prov.site_items(JOB, "site-a", {"provenance": items[:16],
                                         "certificate": site.cert.read_text()})
        body = {"provenance": items[16:], "certificate": site.cert.read_text()}
    prov.site_items(JOB, "site-a", body)
    assert "was left out" in caplog.text
    verified = verify(prov.export(JOB), kits["server"].ca.read_bytes())
    assert len(verified.entries) == {"too many": 18, "repeated": 3}.get(bad, 2)


def test_a_job_without_a_record_says_so(kits, jobs_dir):
    with pytest.raises(ProvenanceError, match="has no provenance record"):
        ServerProvenance(kits["server"], jobs_dir, "9.9").export(JOB)


def _round_entries(record: bytes) -> list[tuple[int, str]]:
    entries = [json.loads(e["entry"]) for e in json.loads(record)["entries"]]
    return [(e["body"]["round"], e["body"]["digest"]) for e in entries
            if e["kind"] == "round.model"]


def test_each_round_is_stated_as_its_report_arrives_and_once(kits, jobs_dir, caplog):
    """A round.model entry per round report, at once (a record exported mid-job names the rounds
    done); a round stated again with the same digest (a resumed job's re-run round, or the
    results file read at the end) is not stated twice, also by a restarted server."""
    d1, d2, d2b = ("sha256:" + c * 64 for c in "12b")
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    prov.round_model(JOB, 1, d1)
    assert _round_entries(prov.export(JOB)) == [(1, d1)]  # mid-job
    prov.round_model(JOB, 1, d1)
    again = ServerProvenance(kits["server"], jobs_dir, "9.9")  # a restarted server
    again.round_model(JOB, 1, d1)
    again.round_model(JOB, 2, d2)
    for bad in ((0, d1), (True, d1), ("3", d1), (3, "sha256:12"), (3, d1.upper()), (3, None)):
        again.round_model(JOB, *bad)  # job code's report: only a round and a digest are kept
    assert "its round.model entry was not made" in caplog.text
    results = jobs_dir / JOB / "run" / "server" / "results"
    results.mkdir(parents=True)
    (results / "model_digests.jsonl").write_text(
        "".join(json.dumps({"round": r, "digest": d}) + "\n" for r, d in ((1, d1), (2, d2))))
    again.finished(JOB, "COMPLETED", "")
    verified = verify(again.export(JOB), kits["server"].ca.read_bytes())
    assert [e.kind for e in verified.entries] == [
        "job.signed", "server.intake", "round.model", "round.model", "job.final"]
    assert _round_entries(again.export(JOB)) == [(1, d1), (2, d2)]
    # a re-run round whose model came out differently is stated again: the later one counts
    third = ServerProvenance(kits["server"], jobs_dir, "9.9")
    third.round_model(JOB, 2, d2b)
    assert _round_entries(third.export(JOB))[-1] == (2, d2b)


def test_a_round_lost_with_a_restart_is_stated_from_the_results_at_the_end(kits, jobs_dir):
    d1 = "sha256:" + "a" * 64
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    results = jobs_dir / JOB / "run" / "server" / "results"
    results.mkdir(parents=True)
    (results / "model_digests.jsonl").write_text(
        json.dumps({"round": 1, "digest": d1}) + "\nnot json\n"
        + json.dumps({"round": 2, "digest": "md5:00"}) + "\n")
    prov.finished(JOB, "COMPLETED", "")
    assert _round_entries(prov.export(JOB)) == [(1, d1)]


def test_a_line_torn_by_a_crash_is_cut_and_the_chain_goes_on_whole(kits, jobs_dir):
    """A machine that crashed mid-write left half a line: the restarted server cuts it off, so
    the next entry is a line of its own, linked to the last whole one."""
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    items = jobs_dir / JOB / ITEMS_FILE
    whole = items.read_bytes()
    items.write_bytes(whole + b'{"item": {"seq": 2, "prev": "sha')  # torn: no newline
    again = ServerProvenance(kits["server"], jobs_dir, "9.9")
    again.round_model(JOB, 1, "sha256:" + "1" * 64)
    again.finished(JOB, "COMPLETED", "")
    verified = verify(again.export(JOB), kits["server"].ca.read_bytes())
    assert [e.kind for e in verified.entries] == [
        "job.signed", "server.intake", "round.model", "job.final"]
    assert items.read_bytes().startswith(whole) and items.read_bytes().count(b"\n") == 4


def test_round_entries_are_bounded_even_when_one_round_flips_its_digest(kits, jobs_dir,
                                                                         monkeypatch):
    import atoll.server.provenance as server_provenance

    monkeypatch.setattr(server_provenance, "MAX_ROUNDS", 3)
    prov = ServerProvenance(kits["server"], jobs_dir, "9.9")
    prov.taken_in(JOB, "alpha", "lead@a.org", "sha256:x")
    for n in range(6):  # job code states round 1 again and again, each time differently
        prov.round_model(JOB, 1, "sha256:" + "ab"[n % 2] * 64)
    again = ServerProvenance(kits["server"], jobs_dir, "9.9")  # counted again from the file
    again.round_model(JOB, 2, "sha256:" + "c" * 64)
    assert len(_round_entries(again.export(JOB))) == 3

