"""A parent's long-lived signature verifier (pki/verifier.py): the same answers as a check in a
new process, in the same process from job to job, and a new process whenever it is busy or gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from atoll.pki import verifier
from atoll.pki.job_signature import SIGNATURE_FILE, SignatureError, check_tree

from .test_job_signature import PROJECT, ca_pem, job, lead, signed_tree, verify  # noqa: F401


@pytest.fixture
def parents(monkeypatch):
    """This test process as a parent with a verifier (prestart), stopped afterwards."""
    monkeypatch.setattr(verifier, "_PARENTS", None)
    verifier.prestart()
    yield verifier._PARENTS
    verifier._PARENTS._drop()


def test_it_answers_as_the_check_in_a_new_process_does(job, lead, ca_pem, parents):  # noqa: F811
    tree = signed_tree(job, lead)
    first = parents.check(ca_pem, tree, 60)
    pid = parents._proc.pid
    assert first == check_tree(ca_pem, tree)
    assert first[0] == 0 and json.loads(first[1])["signer"]["name"] == "lead@hospital-a.org"
    assert verify(tree, ca_pem).signer.name == "lead@hospital-a.org"  # the whole intake check
    assert parents._proc.pid == pid  # one process from job to job


def test_a_changed_job_is_refused_through_it(job, lead, ca_pem, parents):  # noqa: F811
    tree = signed_tree(job, lead)
    (tree / "app" / "train.py").write_text("import os; os.system('x')\n")
    code, out = parents.check(ca_pem, tree, 60)  # what is there; the parent compares
    assert code == 0 and json.loads(out)["files"]["app/train.py"] != json.loads(out)[
        "statement"]["files"]["app/train.py"]
    with pytest.raises(SignatureError, match="changed after it was signed: app/train.py"):
        verify(tree, ca_pem)
    bundle = json.loads((tree / SIGNATURE_FILE).read_text())
    bundle["statement"] = bundle["statement"].replace('"pathology"', '"outcomes"')
    (tree / SIGNATURE_FILE).write_text(json.dumps(bundle))
    code, out = parents.check(ca_pem, tree, 60)
    assert code == 2 and "the statement was changed after it was signed" in out
    assert parents._proc.poll() is None  # a refusal is an answer, not a crash


def test_a_verifier_that_died_is_started_again(job, lead, ca_pem, parents):  # noqa: F811
    tree = signed_tree(job, lead)
    old = parents._proc
    old.kill()
    old.wait()
    assert verify(tree, ca_pem).signer.name == "lead@hospital-a.org"
    assert parents._proc is not old and parents._proc.poll() is None


def test_a_busy_verifier_sends_the_job_to_a_new_process(job, lead, ca_pem, parents):  # noqa: F811
    tree = signed_tree(job, lead)
    (tree / "meta.json").write_text("{}")
    with parents._lock:  # another job is being checked
        assert parents.check(ca_pem, tree, 60) is None
        with pytest.raises(SignatureError, match="changed after it was signed: meta.json"):
            verify(tree, ca_pem)


def test_a_malformed_request_is_answered_with_the_error_not_a_crash():
    proc = subprocess.run([sys.executable, "-P", "-m", "atoll.pki.verifier"],
                          input=b"{\"ca\": 1}\n", capture_output=True, check=True, timeout=120)
    answer = json.loads(proc.stdout)
    assert answer["code"] == 1 and "TypeError" in answer["out"]


def test_it_ends_when_idle_or_when_its_parent_closes_the_pipe():
    idle = subprocess.Popen([sys.executable, "-P", "-m", "atoll.pki.verifier", "0.01"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert idle.wait(timeout=120) == 0  # nothing asked: it gave its memory back
    orphan = subprocess.Popen([sys.executable, "-P", "-m", "atoll.pki.verifier"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    orphan.stdin.close()  # what a parent's end does, however it ends
    assert orphan.wait(timeout=120) == 0


def test_the_parent_never_loads_cryptography(job, lead, ca_pem):  # noqa: F811
    tree = signed_tree(job, lead)
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from atoll.pki import verifier
        from atoll.pki.job_signature import verify_job_tree
        verifier.prestart()
        signed = verify_job_tree(Path({str(tree)!r}), Path({str(ca_pem)!r}), {PROJECT!r},
                                 "pathology")
        print(signed.signer.name, "cryptography" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.split() == ["lead@hospital-a.org", "False"]


def test_a_check_before_the_delayed_start_starts_it(job, lead, ca_pem, monkeypatch):  # noqa: F811
    monkeypatch.setattr(verifier, "_PARENTS", None)
    verifier.prestart(3600.0)  # a parent's timer, which has not fired yet
    try:
        assert verifier._PARENTS._proc is None
        assert verify(signed_tree(job, lead), ca_pem).signer.name == "lead@hospital-a.org"
        proc = verifier._PARENTS._proc
        assert proc is not None and proc.poll() is None
        # not a process "under" the parent's workspace, which `atoll poc down` would count
        assert os.readlink(f"/proc/{proc.pid}/cwd") == "/"
    finally:
        verifier._PARENTS._drop()


def test_a_parent_that_is_up_starts_it_before_its_timer(monkeypatch):
    monkeypatch.setattr(verifier, "_PARENTS", None)
    verifier.parent_up()  # not a parent (no prestart): nothing to start
    assert verifier._PARENTS is None
    verifier.prestart(3600.0)  # a parent's timer, which has not fired yet
    try:
        assert verifier._PARENTS._proc is None
        verifier.parent_up()  # a site connected to its server (site/connection.py)
        proc = verifier._PARENTS._proc
        assert proc is not None and proc.poll() is None
        verifier.parent_up()  # once: the same process
        assert verifier._PARENTS._proc is proc
    finally:
        verifier._PARENTS._drop()


def test_it_keeps_openssl_out_until_a_large_file_needs_it(job, lead, ca_pem, parents):  # noqa: F811
    """The verifier lives beside the jobs: CPython's own SHA-256 for the statements and a job's
    small files, OpenSSL's (libcrypto, 3.5 MiB resident) loaded only for a large file."""
    from atoll.base.sha256 import LARGE

    def openssl_loaded() -> bool:
        with open(f"/proc/{parents._proc.pid}/maps") as maps:
            return "libcrypto.so" in maps.read()

    tree = signed_tree(job, lead)
    assert parents.check(ca_pem, tree, 60) == check_tree(ca_pem, tree)
    assert not openssl_loaded()
    (tree / "app" / "weights.bin").write_bytes(os.urandom(LARGE))
    code, out = parents.check(ca_pem, tree, 60)
    assert (code, out) == check_tree(ca_pem, tree)  # the same digests either way
    assert code == 0 and "app/weights.bin" in json.loads(out)["files"]
    assert openssl_loaded()
