"""The server worker's own check of its job, before any of the job's code runs.

The server parent checks a job's signer against its revocation list at intake, at dispatch
and just before it launches the server worker (server/job_signer.py). The worker checks once
more, in the job layer, so that no slip of the parent's queue or state (a job store edited to
put a revoked user's job back in the queue, a list that arrived while the worker was being
started) lets a revoked user's ``initial_model`` or workflow class run: the job's signature
(``signed/`` beside the app: its ``meta.json`` and signature file, kept by the parent or taken
from the fetched zip) must be a user certificate the project's CA issued, valid now and not on
the CA-signed list the parent holds at registration, whose key signed exactly the meta.json and
the server's app files at hand.

What it trusts is what its parent hands it at registration (the root CA and the list): it
guards against the parent's bookkeeping, not against a parent whose code is hostile, which
starts what it likes on its own host.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atoll.pki.job_signature import (
    SIGNATURE_FILE,
    SignatureError,
    check_files,
    manifest_of_tree,
    read_bundle,
    verify_bundle,
)
from atoll.pki.revocation import CRLError
from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.spec.meta_plain import META_FILE

SIGNED_DIR = "signed"  # beside the worker's app/: the job's meta.json and signature
KEPT = (META_FILE, SIGNATURE_FILE)


class NotTrusted(AtollError):
    """The server worker will not run the job; the message is the reason its status shows."""

    exit_code = EXIT_INVALID


def keep_signed(tree: Path, workdir: Path) -> None:
    """Keep the job's meta.json and signature from ``tree`` (an unpacked job) in the run
    folder, for ``check``."""
    folder = workdir / SIGNED_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in KEPT:
        if (tree / name).is_file():
            shutil.copyfile(tree / name, folder / name)


def check(workdir: Path, trust: dict[str, Any] | None) -> None:
    """NotTrusted unless the job in ``workdir`` (``signed/`` and ``app/``) is signed by a user
    of the CA in ``trust["ca"]`` who is not on the list ``trust["crl"]`` (PEM texts)."""
    if not isinstance(trust, dict) or not isinstance(trust.get("ca"), str):
        raise NotTrusted("the server worker refused to run the job: its parent sent no root "
                         "CA to check the job's signature against")
    ca_pem = trust["ca"].encode("ascii", "replace")
    try:
        revoked = _revoked(ca_pem, trust.get("crl") or "")
        signed = verify_bundle(read_bundle(workdir / SIGNED_DIR), ca_pem,
                               revoked=lambda cert: revoked.get(cert.serial_number))
        meta_bytes = (workdir / SIGNED_DIR / META_FILE).read_bytes()
        app = _server_app(meta_bytes)
        files = {f"{app}/{path}": digest
                 for path, digest in manifest_of_tree(workdir / "app").items()}
        files[META_FILE] = hashlib.sha256(meta_bytes).hexdigest()
        check_files(signed.statement, files,
                    scope=lambda path: path.split("/", 1)[0] in (app, META_FILE))
    except (SignatureError, CRLError) as exc:
        raise NotTrusted(f"the server worker refused to run the job: {exc}; none of the "
                         "job's code ran") from None
    except OSError as exc:
        raise NotTrusted(f"the server worker refused to run the job: its signed files cannot "
                         f"be read ({exc.strerror}); none of the job's code ran") from None


class Checker:
    """``check`` in a child forked at the worker's start, before gRPC or any thread exists (a
    fork later inherits gRPC's threads half-way: its fork handlers restart them in the child,
    or log that other threads were calling into it). The child loads cryptography while the
    worker registers and fetches its app, checks the job it is asked about, and exits: the
    worker itself never loads cryptography, which it would keep resident beside the model for
    the whole job (about 10 MiB). A new interpreter instead cost the tiny job 50-80 ms."""

    def __init__(self) -> None:
        asked, self._ask = os.pipe()
        self._answer, answering = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(self._ask)
                os.close(self._answer)
                code = _child(asked, answering)
            finally:
                os._exit(code)  # nothing of the worker's flushed or closed twice
        os.close(asked)
        os.close(answering)

    def ask(self, workdir: Path, trust: dict[str, Any] | None) -> Callable[[], None]:
        """Ask the child about the job in ``workdir``; the function returned waits for its
        answer and raises its NotTrusted. A child that ends without one refuses the job too."""
        request = json.dumps({"workdir": str(workdir), "trust": trust}).encode()
        # a long CRL may fill the pipe while the child still loads: written beside the worker
        sending = threading.Thread(target=self._send, args=(request,), name="signed-job-check",
                                   daemon=True)
        sending.start()

        def verdict() -> None:
            sending.join()
            with os.fdopen(self._answer, "rb") as answer:
                said = answer.read().decode("utf-8", "replace").strip()
            code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            if code == 0:
                return
            if code == NotTrusted.exit_code and said:
                raise NotTrusted(said)
            raise NotTrusted(f"the server worker refused to run the job: its signature check "
                             f"ended with code {code} ({said[:500] or 'no message'}); none of "
                             "the job's code ran")

        return verdict

    def _send(self, request: bytes) -> None:
        try:
            with os.fdopen(self._ask, "wb") as pipe:
                pipe.write(request)
        except OSError:  # the child is gone: its end says why
            pass


def _child(asked: int, answering: int) -> int:
    """The Checker's child: cryptography loaded, then one request (or none: the worker went on
    without asking, refused or ended), its answer on ``answering``; the exit code, 0 only for
    a job that passed the check."""
    code, said = 1, b"the check stopped before its answer"
    try:
        from atoll.pki.job_signature import warm

        warm()
        with os.fdopen(asked, "rb") as pipe:
            request = pipe.read()
        if not request:  # fails closed: only a check that passed answers 0
            return 1
        job = json.loads(request)
        try:
            check(Path(job["workdir"]), job.get("trust"))
            code, said = 0, b""
        except NotTrusted as exc:
            code, said = NotTrusted.exit_code, str(exc).encode("utf-8", "replace")
    except BaseException as exc:  # noqa: BLE001 - named to the worker, which refuses
        said = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
    view = memoryview(said)
    while view:
        view = view[os.write(answering, view):]
    return code


def _revoked(ca_pem: bytes, crl_pem: str) -> dict[int, str]:
    """serial -> why, from the list ``crl_pem`` once the CA has been checked to sign it."""
    if not crl_pem:
        return {}
    from cryptography import x509

    from atoll.pki.crl import read_crl
    from atoll.pki.revocation import Revoked

    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError as exc:
        raise CRLError(f"the root CA its parent sent cannot be read: {exc}") from None
    number, _, entries = read_crl(crl_pem.encode("ascii", "replace"), ca)
    return {e.serial: f"{Revoked(e.serial, e.revoked_at.isoformat(), e.reason).describe()} "
                      f"(revocation list {number})" for e in entries}


def _server_app(meta_bytes: bytes) -> str:
    from atoll.spec.errors import SpecError
    from atoll.spec.meta_plain import read_meta  # the models only for an uncommon meta

    try:
        app = read_meta(meta_bytes).app_for("server")
    except SpecError as exc:
        raise SignatureError(f"the job's meta.json cannot be read: {exc}") from None
    if app is None:
        raise SignatureError("the job's signed meta.json deploys no app to the server")
    return app
