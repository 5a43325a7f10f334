"""Provenance on a real local federation (server and two sites as processes, mutual TLS, real
kits, SQLite): a FedAvg job's record, exported with `atoll job provenance`, verifies offline
with the CA certificate and the downloaded model alone; site-2 runs under `code_approval:
required` and its entry names the approval; a byte changed in the record, the model or an
entry dropped fails, naming the entry; an entry the server's key signed in a site's name fails
verification naming it, and the server refuses one a site's own link sends. Each site's own log
lists the job."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time

import grpc
import pytest

from atoll import __version__
from atoll.pki.kit import load_kit
from atoll.pki.provenance import site_entry
from atoll.pki.tls import channel_credentials
from atoll.wire import messages as msg
from atoll.wire import rpc
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, job_folder

SITES = ["site-1", "site-2"]
APPROVAL = {"format_version": "1.0", "permissions": {"project_admin": "any", "lead": "any"},
            "code_approval": "required"}
TRAIN = '''
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 1.0}, num_examples=1))
        continue
    fl.send(fl.Model(params={k: v + 1 for k, v in model.params.items()}, num_examples=10))
'''
MODEL = '''
import numpy as np

def make():
    return {"w": np.zeros((2, 2), np.float32)}
'''
APP = """server:
  workflow: fedavg
  args: {num_rounds: 2, round_timeout: 120}
  initial_model: model.py:make
site:
  script: train.py
"""


def atoll(*args, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "atoll", *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


# site-1 maps a dataset and publishes its fingerprint: its launch entry states both, never the path
FINGERPRINT = "sha256:" + "5e" * 32


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    data = tmp_path_factory.mktemp("scans")
    runtime = ("format_version: 2\nstudies:\n  default:\n    datasets:\n      scans: "
               f"{{source: {data}, mode: ro, fingerprint: '{FINGERPRINT}'}}\n")
    fed = Federation.provisioned(tmp_path_factory.mktemp("prov"), SITES, USERS,
                                 runtime={"site-1": runtime})
    (fed.kit("site-2") / "local" / "authorization.json").write_text(json.dumps(APPROVAL))
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def finished(fed, tmp_path_factory):
    """A job that completed, its record exported and its results downloaded."""
    tmp = tmp_path_factory.mktemp("job")
    folder = job_folder(tmp / "fedavg", {"name": "fedavg", "deploy_map": {"app": ["@ALL"]}},
                        APP, {"train.py": TRAIN, "model.py": MODEL})
    atoll("site", "approve", fed.kit("site-2"), folder)
    with fed.session(ADMIN) as s:
        job = s.submit(folder, wait=True, timeout=300)
        assert job["state"] == "FINISHED:COMPLETED", job
        results = s.download(job["job_id"], tmp / "out")
    record = tmp / "provenance.json"
    atoll("job", "provenance", job["job_id"], "--out", record, "--kit", fed.kit(ADMIN))
    model = next(results.rglob("global_model_final.safetensors"))
    return job["job_id"], record, model, results, fed.kit(ADMIN) / "startup" / "rootCA.pem"


def verify(record, ca, *extra):
    return atoll("provenance", "verify", record, "--ca", ca, *extra, "--format", "json",
                 check=False)


def test_the_record_verifies_offline_with_the_ca_and_the_model(finished):
    job_id, record, model, results, ca = finished
    done = verify(record, ca, "--model", model)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["job_id"] == job_id and doc["model_checked"] is True
    kinds = [(e["kind"], e["by"]) for e in doc["entries"]]
    assert kinds[:2] == [("job.signed", "server server"), ("server.intake", "server server")]
    assert kinds[-1] == ("job.final", "server server")
    rounds = [e for e in json.loads(record.read_text())["entries"]
              if '"kind":"round.model"' in e["entry"]]
    assert [json.loads(e["entry"])["body"]["round"] for e in rounds] == [1, 2]
    final = json.loads(json.loads(record.read_text())["entries"][-1]["entry"])["body"]
    assert json.loads(rounds[-1]["entry"])["body"]["digest"] == final["model_digest"]
    for site in SITES:  # each site's own two entries, signed with its key
        assert ("site.decision", f"site {site}") in kinds
        assert ("site.launch", f"site {site}") in kinds
    entries = json.loads(record.read_text())["entries"]
    bodies = {(json.loads(e["entry"])["kind"], json.loads(e["entry"])["by"]["name"]):
              json.loads(e["entry"])["body"] for e in entries}
    decision = bodies[("site.decision", "site-2")]
    assert decision["code_approval"] == "required"
    assert decision["approval"]["digest"] == bodies[("job.signed", "server")]["content_digest"]
    assert bodies[("site.decision", "site-1")]["code_approval"] == "not required"
    assert bodies[("site.launch", "site-1")]["launcher"] == "process"
    assert bodies[("site.launch", "site-1")]["datasets"] == [
        {"name": "scans", "mode": "ro", "fingerprint": FINGERPRINT}]  # the site's own word
    assert "scans" not in str(bodies[("site.launch", "site-2")])
    assert "/scans" not in record.read_text()  # the dataset's path is nowhere in the record
    for site in SITES:  # what its launcher rendered for the job (launchers/base.py)
        assert bodies[("site.launch", site)]["render_digest"].startswith("sha256:")
    assert (bodies[("site.launch", "site-1")]["render_digest"]
            != bodies[("site.launch", "site-2")]["render_digest"])  # each site's own process
    assert (results / "provenance.json").is_file()  # the download holds the record too
    assert verify(results / "provenance.json", ca, "--model", model).returncode == 0


def test_one_byte_of_the_model_changed_fails_naming_the_final_entry(finished, tmp_path):
    _, record, model, _, ca = finished
    changed = tmp_path / model.name
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    done = verify(record, ca, "--model", changed)
    assert done.returncode == 2
    message = json.loads(done.stdout)["error"]["message"]
    assert "(job.final by server server): the model file's digest" in message


def test_a_byte_changed_in_a_sites_entry_fails_naming_it(finished, tmp_path):
    _, record, _, _, ca = finished
    doc = json.loads(record.read_text())
    seq = next(i for i, e in enumerate(doc["entries"])
               if '"kind":"site.launch"' in e["entry"] and '"name":"site-2"' in e["entry"])
    doc["entries"][seq]["entry"] = doc["entries"][seq]["entry"].replace('"mode"', '"Mode"', 1) \
        if '"mode"' in doc["entries"][seq]["entry"] else \
        doc["entries"][seq]["entry"].replace('"process"', '"processX"', 1)
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(doc))
    done = verify(tampered, ca)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["message"].startswith(
        f"entry {seq} (site.launch by site site-2)")


def test_an_entry_dropped_fails_naming_the_next(finished, tmp_path):
    _, record, _, _, ca = finished
    doc = json.loads(record.read_text())
    del doc["entries"][2]
    dropped = tmp_path / "dropped.json"
    dropped.write_text(json.dumps(doc))
    done = verify(dropped, ca)
    assert done.returncode == 2
    assert "entry 2 (" in json.loads(done.stdout)["error"]["message"]
    assert "says it is entry 3" in json.loads(done.stdout)["error"]["message"]


def test_each_site_keeps_its_own_log_of_the_job(fed, finished):
    job_id = finished[0]
    for site in SITES:
        done = atoll("site", "jobs", fed.kit(site), "--format", "json")
        decisions = [r["decision"] for r in json.loads(done.stdout)["jobs"]
                     if r["job_id"] == job_id]
        assert decisions == ["launched", "finished:COMPLETED"], done.stdout


def test_a_sites_refusal_is_its_own_signed_entry_and_in_its_log(fed, finished, tmp_path):
    """site-2 (code_approval: required) refuses code it did not approve: its refusal, signed
    with its key, is in the record, which still verifies; its log names the signed job."""
    folder = job_folder(tmp_path / "unreviewed", {"name": "unreviewed",
                                                  "deploy_map": {"app": ["@ALL"]},
                                                  "min_clients": 1},
                        APP, {"train.py": TRAIN + "\n# not reviewed\n", "model.py": MODEL})
    with fed.session(ADMIN) as s:
        job = s.submit(folder, wait=True, timeout=300)
        assert job["parts"]["site-2"]["state"] == "FINISHED:FAILED", job
    record = tmp_path / "refused.json"
    atoll("job", "provenance", job["job_id"], "--out", record, "--kit", fed.kit(ADMIN))
    done = verify(record, finished[4])
    assert done.returncode == 0, done.stdout + done.stderr
    entries = [json.loads(e["entry"]) for e in json.loads(record.read_text())["entries"]]
    refusal = next(e for e in entries if e["kind"] == "site.decision"
                   and e["by"]["name"] == "site-2")
    assert refusal["body"]["decision"] == "refused"
    assert "runs only jobs its operator approved" in refusal["body"]["reason"]
    assert not any(e["kind"] == "site.launch" and e["by"]["name"] == "site-2" for e in entries)
    log = json.loads(atoll("site", "jobs", fed.kit("site-2"), "--format", "json").stdout)
    line = next(r for r in log["jobs"] if r["job_id"] == job["job_id"])
    assert line["decision"] == "refused"
    assert line["job_digest"] == entries[0]["body"]["content_digest"]


def _forged_in_site2s_name(fed, job_id: str, statement: str, body: dict) -> dict:
    """A site.decision in site-2's name, about the job's very submission, signed with the
    server kit's key: what a server (or whoever holds its key) would write for a site."""
    server = load_kit(fed.kit("server"))
    return site_entry(job_id, statement, "site.decision", "site-2", body,
                      server.key.read_bytes(), server.cert.read_bytes(), at=int(time.time()))


def test_an_entry_the_server_signed_in_a_sites_name_fails_naming_it(fed, finished, tmp_path):
    """site-2's real site.decision replaced by one the server's key signed (same place, same
    link): verification fails at that entry, saying who signed it."""
    job_id, record, _, _, ca = finished
    doc = json.loads(record.read_text())
    seq = next(i for i, e in enumerate(doc["entries"])
               if '"kind":"site.decision"' in e["entry"] and '"name":"site-2"' in e["entry"])
    real = json.loads(doc["entries"][seq]["entry"])
    forged = _forged_in_site2s_name(fed, job_id, real["job_statement"],
                                    {**real["body"], "code_approval": "not required"})
    doc["entries"][seq] = {"seq": seq, "prev": doc["entries"][seq]["prev"], **forged}
    out = tmp_path / "forged.json"
    out.write_text(json.dumps(doc))
    done = verify(out, ca)
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout)["error"]["message"].startswith(
        f"entry {seq} (site.decision by site site-2) is stated in the name of site site-2 but "
        "signed by server server")


def test_the_server_refuses_a_sites_entry_not_signed_by_that_site(fed, finished, tmp_path):
    """The live path: site-2's own link (its real kit, mutual TLS) reports an entry in its own
    name signed with the server's key, then one signed with its own. The server keeps only the
    second; the record verifies."""
    fed.kill("site-2")  # its link is ours for this test
    site2 = load_kit(fed.kit("site-2"))
    channel = grpc.secure_channel(site2.server_address, channel_credentials(site2))
    outbox: queue.Queue = queue.Queue()

    def events():
        yield msg.SiteEvent(hello=json.dumps({"launcher": "process", "version": __version__,
                                              "capacity": {}, "running_jobs": []}))
        while (body := outbox.get()) is not None:
            yield msg.SiteEvent(job_state=json.dumps(body))

    stream = rpc.stub(channel, "Federation").Connect(events(), timeout=120)
    try:
        assert next(stream).WhichOneof("kind") == "welcome"
        folder = job_folder(tmp_path / "live", {"name": "live", "deploy_map": {"app": ["@ALL"]},
                                                "min_clients": 1},
                            APP, {"train.py": TRAIN, "model.py": MODEL})
        atoll("site", "approve", fed.kit("site-2"), folder)
        with fed.session(ADMIN) as s:
            job_id = s.submit(folder)["job_id"]
        for command in stream:  # the server dispatches the job to site-2
            if command.WhichOneof("kind") == "dispatch" \
                    and json.loads(command.dispatch)["job_id"] == job_id:
                break
        items = fed.workspace("server") / "jobs" / job_id / "provenance.jsonl"
        statement = json.loads(json.loads(items.read_text().splitlines()[0])["item"]["entry"])[
            "body"]["statement_digest"]
        server_cert = load_kit(fed.kit("server")).cert.read_text()
        forged = _forged_in_site2s_name(fed, job_id, statement, {"decision": "accepted"})
        own = site_entry(job_id, statement, "site.note", "site-2", {"note": "its own"},
                         site2.key.read_bytes(), site2.cert.read_bytes(), at=int(time.time()))
        outbox.put({"job_id": job_id, "state": "PROVENANCE", "reason": "",
                    "provenance": [forged], "certificate": server_cert})
        outbox.put({"job_id": job_id, "state": "PROVENANCE", "reason": "",
                    "provenance": [own], "certificate": site2.cert.read_text()})
        outbox.put({"job_id": job_id, "state": "FINISHED:FAILED", "reason": "left on purpose"})
        with fed.session(ADMIN) as s:
            assert s.wait(job_id, timeout=300)["state"].startswith("FINISHED:")
    finally:
        outbox.put(None)
        channel.close()
        fed.start_site("site-2")
    record = tmp_path / "live.json"
    atoll("job", "provenance", job_id, "--out", record, "--kit", fed.kit(ADMIN))
    done = verify(record, finished[4])
    assert done.returncode == 0, done.stdout + done.stderr
    entries = [json.loads(e["entry"]) for e in json.loads(record.read_text())["entries"]]
    by_site2 = [(e["kind"], e["body"]) for e in entries if e["by"]["name"] == "site-2"]
    assert by_site2 == [("site.note", {"note": "its own"})], by_site2
    said = (fed.root / "server.log").read_text(errors="replace")
    assert (f"job {job_id}: a provenance entry of site-2 was left out: entry" in said
            and "stated in the name of site site-2 but signed by server server" in said), said
    fed.wait_online(ADMIN)
