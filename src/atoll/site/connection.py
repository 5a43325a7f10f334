"""The site parent's link to the server: it dials out (no inbound port at the site), sends
hello and heartbeats, receives commands, and reconnects with backoff when the link breaks."""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from atoll.base.reasons import clip
from atoll.pki import verifier
from atoll.wire import messages as msg

log = logging.getLogger("atoll.site.connection")

BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
HEARTBEAT_S = 5.0  # until the server's welcome says otherwise
HEARTBEAT_BOUNDS_S = (1.0, 300.0)  # what the site accepts of the server's word
READY_WAIT_S = 10.0  # how often "waiting for the server" is logged while it is away
KEEP_FINAL = 200  # final job states re-sent after a reconnect, in case one was lost
_WAKE = object()  # wakes the events of a call that ended, so that they stop taking reports


def backoff_s(attempt: int) -> float:
    """The pause before reconnect number `attempt` (0 first): a random point in the second half
    of its step. A server that restarts loses every site at the same moment; at fixed steps,
    thousands of sites would come back in the same instant, time its TLS handshakes out, and
    retry together again."""
    step = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
    return step * (0.5 + 0.5 * random.random())


class ServerLink:
    def __init__(self, channel: grpc.Channel, stub, hello: Callable[[], dict[str, Any]],
                 on_command: Callable[[str, dict[str, Any]], None], address: str = "",
                 redial: Callable[[], tuple[grpc.Channel, Any, str] | None] | None = None):
        self.channel = channel
        # Asked whenever the server is out of reach: a new channel when the site's kit now
        # names another server (site/server_channel.py), else None.
        self._redial = redial
        self.address = address
        self.stub = stub
        self.hello = hello
        self.on_command = on_command
        self.connected = threading.Event()
        self.heartbeat_s = HEARTBEAT_S  # the server's welcome sets it (a large federation's longer)
        self._outbox: queue.Queue = queue.Queue()
        self._final: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._generation = 0
        self._stop = threading.Event()
        self._call = None

    def send_state(self, job_id: str, state: str, reason: str = "", **extra: Any) -> None:
        # clipped: job code writes some reasons, and an oversized report would break the link
        body = {"job_id": job_id, "state": state, "reason": clip(reason), **extra}
        if state.startswith("FINISHED:"):
            self._final[job_id] = body
            while len(self._final) > KEEP_FINAL:
                self._final.popitem(last=False)
        self._outbox.put(body)

    def run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            if not self._wait_for_server():
                continue
            self._generation += 1
            try:
                self._call = self.stub.Connect(self._events(self._generation))
                for command in self._call:
                    if not self.connected.is_set():
                        self.connected.set()
                        attempt = 0
                        log.info("connected to the server")
                        verifier.parent_up()  # up: its signature verifier starts now
                    kind = command.WhichOneof("kind")
                    if kind == "welcome":
                        self.heartbeat_s = heartbeat_of(_command_body(kind, command))
                    elif (body := _command_body(kind, command)) is not None:
                        self.on_command(kind, body)
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    log.warning("server link broken: %s", _describe(exc))
            self.connected.clear()
            self._follow_kit()
            self._generation += 1  # that call's events stop at once (see _events)
            self._outbox.put(_WAKE)
            if self._stop.wait(backoff_s(attempt)):
                break
            attempt += 1

    def _wait_for_server(self) -> bool:
        """Wait until the channel can reach the server; gRPC retries every 0.1 s to 5 s."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=READY_WAIT_S)
            return True
        except grpc.FutureTimeoutError:
            if not self._stop.is_set() and not self._follow_kit():
                log.warning("waiting for the server at %s", self.address or "?")
            return False

    def _follow_kit(self) -> bool:
        new = self._redial() if self._redial is not None else None
        if new is not None:
            self.channel, self.stub, self.address = new
        return new is not None

    def stop(self) -> None:
        self._stop.set()
        self._outbox.put(None)
        if self._call is not None:
            self._call.cancel()

    def _events(self, generation: int) -> Iterator[msg.SiteEvent]:
        yield msg.SiteEvent(hello=json.dumps(self.hello()))
        for body in list(self._final.values()):
            yield msg.SiteEvent(job_state=json.dumps(body))
        while not self._stop.is_set() and generation == self._generation:
            try:
                body = self._outbox.get(timeout=self.heartbeat_s)
            except queue.Empty:
                yield msg.SiteEvent(heartbeat=json.dumps(
                    {"running_jobs": self.hello().get("running_jobs", [])}))
                continue
            if body is None:
                return
            if body is _WAKE:
                continue
            if generation != self._generation:  # taken for a call that ended: the next one's
                self._outbox.put(body)
                return
            yield msg.SiteEvent(job_state=json.dumps(body))


MAX_COMMAND_BYTES = 16 * 1024 * 1024  # a dispatch carries the job's meta.json (bounded too)


def heartbeat_of(welcome: dict[str, Any] | None) -> float:
    """The period the server's welcome asks for, within HEARTBEAT_BOUNDS_S; else the default."""
    value = (welcome or {}).get("heartbeat_s")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return HEARTBEAT_S
    low, high = HEARTBEAT_BOUNDS_S
    return float(min(max(value, low), high))


def _command_body(kind: str | None, command: Any) -> dict[str, Any] | None:
    """A command's JSON object, or None (logged) for one that is not: the server's word never
    stops the link, and the supervisor checks each field of it (spec/names.py)."""
    text = getattr(command, kind, "") if kind else ""
    if len(text) > MAX_COMMAND_BYTES:
        log.warning("ignored a %s command of %d bytes from the server", kind, len(text))
        return None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        log.warning("ignored a %s command from the server: not a JSON object", kind)
        return None
    return body


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"server unreachable ({details}); retrying"
    return f"{code.name if code else 'error'}: {details}"


def wait_connected(link: ServerLink, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return link.connected.wait(max(0.0, deadline - time.monotonic()))
