"""A site worker that outlives its parent (a container, pod or Slurm job whose site parent was
killed or restarted) waits for the next one instead of failing its part: its link to the parent
retries for at most ``rejoin_s`` (the site's supervision.rejoin_s) and registers again with the
job's token when the parent it reaches no longer knows its session (a restarted parent accepts
that token once, for that job only: site/running_parts.py). Local training is then not redone.

Every call goes through ``RejoiningStub``: a unary call is simply made again; a call that
streams its answer (NextTask, FetchApp...) is made again only if nothing of the answer came; a
call that streams its request (SendReply...) first makes sure of the link with a heartbeat (its
payload is an iterator, which cannot be sent twice). A worker started without ``rejoin_s``
behaves as before: the first failed call fails the job.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from atoll.spec.errors import EXIT_CONNECTION, AtollError
from atoll.wire import messages as msg
from atoll.wire.worker_link import SESSION_KEY

# The codes a call gets while its parent is away or was replaced.
AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
RETRY_PAUSE_S = 1.0


class ParentGone(AtollError):
    """No parent took this worker back within rejoin_s."""

    exit_code = EXIT_CONNECTION


class RejoiningStub:
    """The WorkerLink stub, with each call retried (and the worker registered again) while its
    parent is away, for at most ``rejoin_s`` each time."""

    def __init__(self, stub: Any, job_id: str, token: str, session: str, rejoin_s: float,
                 say: Callable[[str], None] | None = None,
                 redial: Callable[[], Any] | None = None):
        self._stub = stub
        # A stub to the address a restarted parent left in the run folder, if it is a new one
        # (wire/parent_address.py), else None
        self._redial = redial or (lambda: None)
        self._job_id = job_id
        self._token = token  # this worker's own: kept in memory only, never in its environment
        self._session = session
        self.rejoin_s = rejoin_s
        self._lock = threading.Lock()
        self._say = say or (lambda text: print(f"atoll worker: {text}", file=sys.stderr,
                                               flush=True))
        self.rejoins = 0

    # -- the calls ---------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        getattr(self._stub, name)  # an unknown method fails here, as on the stub
        if name in ("SendTask", "SendReply", "SendResults"):
            return lambda request_iterator, **kw: self._streamed_request(name, request_iterator,
                                                                          **kw)
        if name in ("FetchApp", "NextTask", "NextReply"):
            return lambda request, **kw: self._streamed_answer(name, request, **kw)
        return lambda request, **kw: self._retried(
            lambda: getattr(self._stub, name)(request, **self._kw(kw)))

    def _kw(self, kw: dict[str, Any]) -> dict[str, Any]:
        """The call's metadata with this worker's current session in place of the one the
        caller captured (a new parent gave it a new one)."""
        metadata = kw.get("metadata")
        if metadata is None:
            return kw
        return {**kw, "metadata": tuple((k, self._session) if k == SESSION_KEY else (k, v)
                                        for k, v in metadata)}

    def _retried(self, attempt: Callable[[], Any]) -> Any:
        deadline = None
        while True:
            try:
                return attempt()
            except grpc.RpcError as exc:
                code = exc.code() if callable(getattr(exc, "code", None)) else None
                if self.rejoin_s <= 0 or code not in AWAY:
                    raise
                deadline = deadline or time.monotonic() + self.rejoin_s
                self._away(code, deadline, exc)

    def _streamed_answer(self, name: str, request, **kw) -> Iterator[Any]:
        deadline = None
        while True:
            got = False
            try:
                for item in getattr(self._stub, name)(request, **self._kw(kw)):
                    got = True
                    yield item
                return
            except grpc.RpcError as exc:
                code = exc.code() if callable(getattr(exc, "code", None)) else None
                if got or self.rejoin_s <= 0 or code not in AWAY:
                    raise
                deadline = deadline or time.monotonic() + self.rejoin_s
                self._away(code, deadline, exc)

    def _streamed_request(self, name: str, request_iterator, **kw) -> Any:
        if self.rejoin_s > 0:  # the link is sure (or a new parent took us) before the payload
            self._retried(lambda: self._stub.Report(
                msg.Json(body=json.dumps({"kind": "heartbeat"})), **self._kw(kw)))
        return getattr(self._stub, name)(request_iterator, **self._kw(kw))

    # -- the parent is away ------------------------------------------------------------------
    def _away(self, code, deadline: float, exc: grpc.RpcError) -> None:
        """Wait a moment, and register again if the parent reached does not know us; raise
        ParentGone past the deadline."""
        if time.monotonic() >= deadline:
            waited, self.rejoin_s = self.rejoin_s, 0  # given up: the calls after (Finish) fail
            raise ParentGone(f"no site parent took this worker back within {waited:g} s "
                             f"(supervision.rejoin_s): {exc.details()}") from None
        if code == grpc.StatusCode.UNAVAILABLE:
            time.sleep(RETRY_PAUSE_S)
            with self._lock:
                if (stub := self._redial()) is not None:  # the parent moved: dial it there
                    self._stub = stub
                    self._say("its site parent is now at another address: dialling it there")
            return
        self._register(deadline)

    def _register(self, deadline: float) -> None:
        seen = self._session
        with self._lock:  # one registration for every call that found the session unknown
            if self._session != seen:
                return
            while True:
                try:
                    answer = self._stub.Register(
                        msg.Json(body=json.dumps({"job_id": self._job_id, "token": self._token,
                                                  "rejoin": True})), timeout=30)
                    self._session = json.loads(answer.body)["session"]
                    self.rejoins += 1
                    self._say(f"job {self._job_id}: rejoined its restarted site parent")
                    return
                except grpc.RpcError as exc:
                    # refused: the parent may not have taken its workers back yet (a moment)
                    if exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.PERMISSION_DENIED) or (
                            time.monotonic() >= deadline):
                        self.rejoin_s = 0
                        raise ParentGone(f"the site parent did not take this worker back: "
                                         f"{exc.details()}") from None
                    time.sleep(RETRY_PAUSE_S)
