"""A parent's long-lived signature verifier: one process of its own, started with the parent.

Why a process: a parent never loads cryptography (pki/job_signature.py). Checking each job in
a new interpreter cost 0.15-0.3 s of the path from submit to the first task, at the server and
again at each site: starting Python, importing atoll and cryptography. The verifier pays that
once, as soon as the parent is up (``parent_up``; ``prestart``'s timer a second after the
parent started is the fallback) or at the first request, whichever comes first, then answers
requests on its stdin/stdout, one JSON line each way::

    -> {"ca": CA_FILE, "tree": TREE}
    <- {"code": 0, "out": WHAT_THE_SIGNATURE_SAYS_AS_JSON} | {"code": 2, "out": REASON}
       | {"code": 1, "out": TRACEBACK}

The parent still decides (job_signature.verify_apart reads the answer); the verifier runs
``check_tree``, the same function ``python -m atoll.pki.job_signature`` runs. It reads nothing
but the paths its parent names, and exits when its parent's end of the pipe closes (the parent
ended, however) or after ``IDLE_S`` without a request, so a quiet parent carries nothing. A
request that finds it busy (another job being checked), gone or broken is checked in a new
process as before: no job waits for another's hashing, and a crash costs one retry.

The parent's other uses of cryptography go to the same process (``ask``), so that no parent
loads it with its first job (0.1 CPU-s and 15 MiB each, at the server on the submit's path):
signing its provenance entries (``{"op": "sign"}``: the key's PEM goes down the pipe, never
into argv or a file) and the server's check of a site's entry (``{"op": "site_item"}``).
Those are answered in the parent itself when there is no verifier or it is busy.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from atoll.spec.errors import EXIT_FAILED, AtollError

IDLE_S = 600.0  # a parent without jobs for ten minutes gives the verifier's memory back
# A parent starts its verifier once it is up (parent_up: its interpreter and cryptography, 0.1
# CPU-s, then do not slow that start down), or this long after its own start if it is not up
# by then (a site that cannot reach its server yet).
START_AFTER_S = 1.0
MODULE = "atoll.pki.verifier"


class CheckTimeout(AtollError, TimeoutError):
    """The check ran past its limit (a job of many GiB on a slow disk)."""

    exit_code = EXIT_FAILED


def _argv(*args: str) -> list[str]:  # -P: atoll itself, never a module of the current folder
    return [sys.executable, "-P", "-m", *args]


class Verifier:
    """The parent's side: at most one verifier process, started on demand once enabled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the verifier now, so that it has imported everything by the first job."""
        with self._lock:
            self._running()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        # cwd /: it reads only the absolute paths it is sent, and is no process "under" the
        # parent's workspace (`atoll poc down` counts those as parents left running)
        self._proc = subprocess.Popen(_argv(MODULE), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, close_fds=True, cwd="/")
        return self._proc

    def _drop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def check(self, ca_file: Path, tree: Path, timeout: float) -> tuple[int, str] | None:
        """The verifier's answer, or None when it is busy or broke (check in a new process)."""
        return self.ask({"op": "check", "ca": str(Path(ca_file).absolute()),
                         "tree": str(Path(tree).absolute())}, timeout)

    def ask(self, request: dict[str, Any], timeout: float) -> tuple[int, str] | None:
        """The answer to one request, or None when the verifier is busy or broke."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            proc = self._running()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], timeout)
                if not ready:
                    self._drop()
                    raise CheckTimeout(f"no answer in {timeout:.0f} s")
                line = proc.stdout.readline()
            except OSError:  # it ended (idle, or a crash) as the request went out
                self._drop()
                return None
            try:
                answer = json.loads(line)
                return int(answer["code"]), str(answer["out"])
            except (ValueError, KeyError, TypeError):  # it ended mid-answer
                self._drop()
                return None
        finally:
            self._lock.release()


_PARENTS: Verifier | None = None  # set by prestart(): only a parent keeps a verifier


def prestart(delay: float = 0.0) -> None:
    """Give this process (a parent) its long-lived verifier, started in ``delay`` seconds (from
    a timer thread) or at the first check, whichever comes first."""
    global _PARENTS
    if _PARENTS is None:
        _PARENTS = Verifier()
    if delay <= 0:
        _PARENTS.start()
        return
    timer = threading.Timer(delay, _PARENTS.start)
    timer.daemon = True
    timer.start()


def parent_up() -> None:
    """The parent is up (the server listens; the site has started its link): start its
    verifier now rather than at prestart's timer, so that a job sent right after a start (a
    `poc up` and a submit) does not wait for the verifier's interpreter and cryptography."""
    if _PARENTS is not None:
        _PARENTS.start()


def ask(op: str, timeout: float = 60.0, **args: Any) -> tuple[int, str] | None:
    """``op`` answered by this parent's verifier: (0, OUT), or (2, REASON) for a refusal; None
    when this process has no verifier (not a parent), or it is busy or broke: answer here."""
    if _PARENTS is None:
        return None
    try:
        answer = _PARENTS.ask({"op": op, **args}, timeout)
    except CheckTimeout:  # it hung, and was stopped: a small request is answered here
        return None
    return None if answer is None or answer[0] == 1 else answer


def check(ca_file: Path, tree: Path, timeout: float) -> tuple[int, str]:
    """``check_tree`` of ``tree`` in a process of its own: this parent's verifier when it has
    one and it is free, else a new ``python -m atoll.pki.job_signature``."""
    if _PARENTS is not None:
        answer = _PARENTS.check(ca_file, tree, timeout)
        if answer is not None:
            return answer
    try:
        done = subprocess.run(_argv("atoll.pki.job_signature", str(ca_file), str(tree)),
                              capture_output=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CheckTimeout(f"no answer in {timeout:.0f} s") from None
    out = done.stdout if done.returncode == 0 else done.stderr
    return done.returncode, out.decode("utf-8", "replace")


def serve(idle_s: float = IDLE_S) -> int:
    """The verifier's own loop: one request at a time until EOF or ``idle_s`` of silence."""
    import signal
    import traceback

    from atoll.pki import job_signature

    # Ctrl-C at a parent in the foreground reaches its whole process group: the parent stops,
    # and its end of the pipe closing ends this process without a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from atoll.pki.job_signature import check_tree

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    job_signature.warm()
    while True:
        ready, _, _ = select.select([stdin], [], [], idle_s)
        if not ready:
            return 0
        line = stdin.readline()
        if not line:
            return 0  # the parent ended
        try:
            code, out = _answer(json.loads(line), check_tree)
        except Exception:  # noqa: BLE001 - the parent logs it and refuses the job
            code, out = 1, traceback.format_exc()
        stdout.write(json.dumps({"code": code, "out": out}).encode("utf-8") + b"\n")
        stdout.flush()


def _answer(request: dict[str, Any], check_tree: Any) -> tuple[int, str]:
    from atoll.pki import provenance

    op = request.get("op", "check")
    if op == "check":
        return check_tree(Path(request["ca"]), Path(request["tree"]))
    try:
        if op == "sign":
            return 0, provenance.signature_here(request["text"].encode("ascii"),
                                                request["key"].encode("ascii"))
        if op == "site_item":
            args = request["args"]
            provenance.check_site_item_here(
                args["item"], args["cert"].encode("ascii"), args["ca"].encode("ascii"),
                args["site"], args["job_id"], args["job_statement"], args["seq"], args["prev"])
            return 0, ""
    except provenance.ProvenanceError as exc:
        return 2, str(exc)
    raise ValueError(f"unknown request {op!r}")


if __name__ == "__main__":
    # as in a parent: the statements and a job's small files hash as fast with CPython's own
    # SHA-256, and libcrypto's 3.5 MiB stay out of a process that lives beside the jobs
    from atoll.base.sha256 import openssl_out_at_rest

    openssl_out_at_rest()
    sys.exit(serve(float(sys.argv[1]) if len(sys.argv) > 1 else IDLE_S))
