"""The endpoint a parent opens for its own job workers (the WorkerLink service).

A worker proves itself once with the one-time job token its launcher gave it (environment only,
never argv); the token is then spent, and the worker uses the session id it got back. A bad,
reused or other-job token is refused.

The endpoint listens on TCP (``worker_endpoint`` in site.yaml) and on a unix socket in a private
folder of its own (mode 0700): a worker with a network namespace of its own (the process
launcher's default, a container on network "none") reaches its parent through that socket,
bound into its sandbox, and through nothing else. The token check is the same on both. What each call does depends on the parent: the server
parent serves the workflow's tasks and replies, a site parent relays them to the server.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.spec.names import IdentifierError, check_job_id, check_task_id
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.bodies import BodyError, WorkerNote
from atoll.wire.grpc_setup import new_server
from atoll.wire.worker_link import HANDOFF_KEY, MANY_REPLIES_KEY, SESSION_KEY

log = logging.getLogger("atoll.parent.worker_endpoint")


class WorkerBackend(Protocol):
    def on_register(self, job_id: str) -> dict[str, Any]: ...
    def app_zip(self, job_id: str) -> Path: ...
    def send_task(self, job_id: str, head: dict[str, Any], chunks: Iterator[bytes]) -> dict: ...
    def next_reply(self, job_id: str, task_id: str, wait_s: float, many: bool = False,
                   as_files: bool = False) -> Iterator[bytes]: ...
    def next_task(self, job_id: str, wait_s: float, as_files: bool = False
                  ) -> Iterator[bytes]: ...
    def send_reply(self, job_id: str, head: dict[str, Any], chunks: Iterator[bytes]) -> dict: ...
    def report(self, job_id: str, body: dict[str, Any]) -> None: ...
    def finish(self, job_id: str, ok: bool, error: str) -> None: ...
    def spend_budget(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def run_folder(self, job_id: str) -> Path: ...
    def keep_checkpoint(self, job_id: str, chunks: Iterator[bytes]) -> dict[str, int]: ...
    def held_checkpoint(self, job_id: str) -> Path | None: ...


class BackendError(AtollError):
    """Raised by a backend to answer the worker with a clear FAILED_PRECONDITION."""

    exit_code = EXIT_INVALID


@dataclass
class _Ticket:
    job_id: str
    token: str
    spent: bool = False


class WorkerTokens:
    """One-time tokens per job, and the sessions they were exchanged for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[str, _Ticket] = {}
        self._sessions: dict[str, str] = {}

    def issue(self, job_id: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tickets[job_id] = _Ticket(job_id, token)
        return token

    def expect(self, job_id: str, token: str) -> None:
        """Accept ``token`` once for ``job_id``: the token an earlier parent of this site gave
        the worker it takes back (site/running_parts.py), which registers again with it."""
        with self._lock:
            self._tickets[job_id] = _Ticket(job_id, token)

    def exchange(self, job_id: str, token: str) -> str | None:
        with self._lock:
            ticket = self._tickets.get(job_id)
            if ticket is None or ticket.spent or not hmac.compare_digest(ticket.token, token):
                return None
            ticket.spent = True
            session = secrets.token_urlsafe(24)
            self._sessions[session] = job_id
            return session

    def job_of(self, session: str) -> str | None:
        with self._lock:
            return self._sessions.get(session)

    def revoke(self, job_id: str) -> None:
        with self._lock:
            self._tickets.pop(job_id, None)
            for session in [s for s, j in self._sessions.items() if j == job_id]:
                del self._sessions[session]


def _body(request, context) -> dict[str, Any]:
    """A worker's JSON body, parsed by its one definition (wire/bodies.py: at most
    MAX_WORKER_BODY bytes; the worker runs the job's code: it is as trusted as that code), else
    INVALID_ARGUMENT."""
    try:
        return WorkerNote.parse(request.body).doc
    except BodyError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def link_security(context: grpc.ServicerContext) -> str:
    """How the calling worker reached the endpoint, as gRPC's transport saw it (not as the
    endpoint was configured): the evidence that a TLS endpoint really spoke TLS."""
    auth = context.auth_context()
    if b"ssl" in auth.get("transport_security_type", []):
        version = b"".join(auth.get("ssl_tls_version", [])).decode(errors="replace")
        return f"TLS ({version or 'version unknown'})"
    if context.peer().startswith("unix:"):
        return "the unix socket (no TLS)"
    return "plaintext TCP"


def _checked(context, check, value: Any, field: str) -> None:
    """An id a worker sent, of its grammar (spec/names.py), else INVALID_ARGUMENT naming it."""
    try:
        check(value, field)
    except IdentifierError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


class WorkerLinkServicer:
    def __init__(self, tokens: WorkerTokens, backend: WorkerBackend):
        self.tokens = tokens
        self.backend = backend

    def _job(self, context: grpc.ServicerContext) -> str:
        session = dict(context.invocation_metadata()).get(SESSION_KEY, "")
        job_id = self.tokens.job_of(session)
        if job_id is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or expired worker session")
        return job_id

    def Register(self, request, context):
        body = _body(request, context)
        job_id, token = body.get("job_id"), str(body.get("token", ""))
        _checked(context, check_job_id, job_id, "the registration's job_id")
        session = self.tokens.exchange(job_id, token)
        if session is None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          "job token refused: it is wrong, already used, or for another job")
        log.info("job %s: its worker registered over %s", job_id, link_security(context))
        info = self._call(context, self.backend.on_register, job_id)
        return msg.Json(body=json.dumps({"session": session, **info}))

    def FetchApp(self, request, context):
        job_id = self._job(context)
        path = self._call(context, self.backend.app_zip, job_id)
        yield frames.header({"size": path.stat().st_size})
        yield from frames.file_frames(path)

    def SendTask(self, request_iterator, context):
        job_id = self._job(context)
        head, chunks = frames.split(request_iterator)
        return msg.Json(body=json.dumps(self._call(context, self.backend.send_task, job_id, head,
                                                  chunks)))

    def NextReply(self, request, context):
        job_id = self._job(context)
        metadata = dict(context.invocation_metadata())
        task_id = metadata.get("x-atoll-task", "")
        _checked(context, check_task_id, task_id, "the x-atoll-task header")
        many = metadata.get(MANY_REPLIES_KEY) == "1"
        as_files = metadata.get(HANDOFF_KEY) == "1"
        yield from self._stream(context, self.backend.next_reply, job_id, task_id, request.wait_s,
                                many, as_files)

    def NextTask(self, request, context):
        job_id = self._job(context)
        as_files = dict(context.invocation_metadata()).get(HANDOFF_KEY) == "1"
        yield from self._stream(context, self.backend.next_task, job_id, request.wait_s,
                                as_files)

    def SendReply(self, request_iterator, context):
        job_id = self._job(context)
        head, chunks = frames.split(request_iterator)
        return msg.Json(body=json.dumps(self._call(context, self.backend.send_reply, job_id, head,
                                                  chunks)))

    def Report(self, request, context):
        job_id = self._job(context)
        self._call(context, self.backend.report, job_id, _body(request, context))
        return msg.Json(body="{}")

    def Finish(self, request, context):
        job_id = self._job(context)
        body = _body(request, context)
        self._call(context, self.backend.finish, job_id, bool(body.get("ok")),
                   str(body.get("error", "")))
        return msg.Json(body="{}")

    def SpendBudget(self, request, context):
        job_id = self._job(context)
        return msg.Json(body=json.dumps(self._call(context, self.backend.spend_budget, job_id,
                                                  _body(request, context))))

    def SendResults(self, request_iterator, context):
        """A worker whose run folder is not ours (a Pod's emptyDir) sends its results/ home."""
        from atoll.wire.job_archive import IntakeError
        from atoll.wire.results_archive import unpack_results

        job_id = self._job(context)
        folder = self._call(context, self.backend.run_folder, job_id)
        _, chunks = frames.split(request_iterator)
        try:
            got = unpack_results(chunks, folder)
        except IntakeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"results refused: {exc}")
        except frames.FrameError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        log.info("job %s: its worker sent %d result files (%d bytes) home", job_id,
                 got["files"], got["bytes"])
        return msg.Json(body=json.dumps(got))

    def SendCheckpoint(self, request_iterator, context):
        """A server worker whose run folder goes with it (a Pod) sends each committed
        checkpoint home (wire/checkpoint_home.py): checked, then kept in place of the last."""
        from atoll.wire.job_archive import IntakeError

        job_id = self._job(context)
        _, chunks = frames.split(request_iterator)
        try:
            got = self._call(context, self.backend.keep_checkpoint, job_id, chunks)
        except IntakeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        log.info("job %s: its worker sent the checkpoint of round %d home (%d bytes)", job_id,
                 got["round"], got["bytes"])
        return msg.Json(body=json.dumps(got))

    def FetchCheckpoint(self, request, context):
        """What the last SendCheckpoint kept, for the job's server worker started again."""
        job_id = self._job(context)
        path = self._call(context, self.backend.held_checkpoint, job_id)
        if path is None:
            yield frames.header({"none": True})
            return
        with open(path, "rb") as held:  # the file, even if a later one replaces its name
            yield frames.header({"size": os.fstat(held.fileno()).st_size})
            yield from frames.data_frames(iter(lambda: held.read(frames.CHUNK), b""))

    @staticmethod
    def _call(context, fn, *args):
        try:
            return fn(*args)
        except BackendError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except frames.FrameError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    @staticmethod
    def _stream(context, fn, *args):
        try:
            yield from fn(*args)
        except BackendError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))


SOCKET_NAME = "worker.sock"
# A unix socket's path is at most 107 bytes: the private folder goes where paths are short.
SOCKET_PARENT = "/tmp"


@dataclass(frozen=True)
class Endpoint:
    server: grpc.Server
    address: str  # host:port workers dial
    cert_pem: str | None  # the endpoint's certificate when it speaks TLS; workers trust it
    # The unix socket workers in a network namespace of their own dial (``unix:`` + this path);
    # its folder is the parent's alone (0700): only a sandbox it is bound into reaches it.
    socket_path: str | None = None

    def stop(self, grace: float) -> None:
        """Stop serving and remove the socket's private folder."""
        self.server.stop(grace).wait(grace + 1)
        if self.socket_path is not None:
            import shutil  # here, not at rest: shutil loads bz2 and lzma

            shutil.rmtree(os.path.dirname(self.socket_path), ignore_errors=True)


def private_socket_folder(prefix: str = "atoll-") -> str:
    """A new folder only this user may enter, for sockets bound into sandboxes one by one."""
    # tempfile.mkdtemp would do, but tempfile loads shutil (and bz2, lzma) into a parent at rest
    base = SOCKET_PARENT if os.path.isdir(SOCKET_PARENT) else os.environ.get("TMPDIR", "/tmp")
    for _ in range(100):
        path = os.path.join(base, prefix + secrets.token_hex(6))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # whatever the umask
        return path
    raise FileExistsError(f"no new folder could be made in {base}")


def start_worker_endpoint(tokens: WorkerTokens, backend: WorkerBackend, host: str, port: int,
                          dial_host: str | None = None, tls: bool = False,
                          unix_socket: bool = True) -> Endpoint:
    """Start the WorkerLink server. With tls, it serves a certificate made now for dial_host.
    With unix_socket, it listens on ``<private folder>/worker.sock`` too (no TLS there: only
    the parent's own user, and the sandboxes it binds the socket into, can reach it)."""
    server = new_server()
    rpc.add_servicer(server, "WorkerLink", WorkerLinkServicer(tokens, backend))
    socket_path = None
    if unix_socket:
        socket_path = os.path.join(private_socket_folder("atoll-w-"), SOCKET_NAME)
        if server.add_insecure_port(f"unix:{socket_path}") == 0:
            raise OSError(f"cannot listen for workers on the unix socket {socket_path}")
    dial_host = dial_host or host
    cert_pem = None
    if tls:
        from atoll.pki.ephemeral import self_signed

        cert, key = self_signed(dial_host)
        bound = server.add_secure_port(f"{host}:{port}",
                                       grpc.ssl_server_credentials([(key, cert)]))
        cert_pem = cert.decode()
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        if socket_path is not None:
            import shutil

            shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)
        raise OSError(f"cannot listen for workers on {host}:{port}")
    server.start()
    address = f"[{dial_host}]:{bound}" if ":" in dial_host else f"{dial_host}:{bound}"
    return Endpoint(server, address, cert_pem, socket_path)
