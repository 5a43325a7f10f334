"""Who is calling: identity, org and role come from the verified client certificate only.

A `Gate` admits each call of a service before its request is read (wire/guard.py): the
certificate must be of the service's kind, and each certificate has limits of its own (calls
open at once, calls per second) so that one peer, hostile or careless, cannot take the server
from the others. Refusals of the wrong kind of certificate are audited.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import grpc

from atoll.pki.identity import Identity, IdentityError, identity_from_cert, identity_from_subject
from atoll.server import revocation
from atoll.spec.errors import EXIT_AUTH, AtollError

log = logging.getLogger("atoll.server.auth")


@dataclass(frozen=True)
class PeerLimit:
    calls: int  # calls one certificate may have open at once
    rate: float  # calls per second it may start, sustained...
    burst: int  # ...and at once, above that rate


# A site keeps a control stream, a task long poll and a reply per running job; a 4 KiB round
# takes about 0.05 s here, so a site makes about 60 calls a second in a fast job.
LIMITS = {"site": PeerLimit(calls=64, rate=300.0, burst=600),
          "admin": PeerLimit(calls=16, rate=100.0, burst=200),
          "server": PeerLimit(calls=4, rate=10.0, burst=20)}
LOG_EVERY_S = 30.0  # one warning per peer and reason in this time, not one per refused call
# One audit entry per certificate and refused call in this time; the next one counts the rest
# (a peer refused 100 times a second must not fill the job store's disk).
AUDIT_EVERY_S = 10.0


class PeerRefused(AtollError):
    exit_code = EXIT_AUTH

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


# The caller a Gate admitted, with the call (its context) it admitted it for. A handler on the
# event loop runs in the task its admission ran in (gRPC starts a task per call), so it takes
# the caller from here instead of reading and checking the certificate a second time.
_ADMITTED: contextvars.ContextVar[tuple[object, Identity] | None] = contextvars.ContextVar(
    "atoll_admitted", default=None)


@lru_cache(maxsize=1024)
def _identity(pem: bytes) -> Identity:
    return identity_from_cert(pem)


@lru_cache(maxsize=1024)
def fingerprint(pem: bytes) -> str:
    """The certificate's SHA-256 fingerprint (of its DER form), as `openssl x509 -fingerprint`
    prints it without the colons: what an audit entry names a certificate by. (Not with `ssl`:
    it would load the system OpenSSL into a parent that has no other use for it.)"""
    begin, end = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
    body = pem.partition(begin)[2].partition(end)[0]
    return hashlib.sha256(base64.b64decode(b"".join(body.split()))).hexdigest()


def peer_fingerprint(context, auth: dict | None = None) -> str:
    pems = (auth if auth is not None else context.auth_context()).get("x509_pem_cert")
    return fingerprint(pems[0]) if pems else ""


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def check_peer(context, kind: str) -> Identity:
    """The caller's identity; PeerRefused unless its certificate is of the expected kind."""
    identity = _peer(context)
    if identity.kind != kind:
        raise PeerRefused(grpc.StatusCode.PERMISSION_DENIED,
                          f"{identity.name} holds {_a(identity.kind)} certificate; this call "
                          f"needs {_a(kind)} certificate")
    return identity


def _peer(context, auth: dict | None = None) -> Identity:
    auth = auth if auth is not None else context.auth_context()
    pems = auth.get("x509_pem_cert")
    if not pems:
        raise PeerRefused(grpc.StatusCode.UNAUTHENTICATED, "a client certificate is required")
    if (revoked := revocation.refusal(pems[0])) is not None:  # the project's CRL, on every call
        raise PeerRefused(grpc.StatusCode.UNAUTHENTICATED, revoked)
    try:
        subjects = auth.get("x509_subject")
        return (identity_from_subject(subjects[0].decode()) if subjects
                else _identity(pems[0]))
    except IdentityError as exc:
        raise PeerRefused(grpc.StatusCode.PERMISSION_DENIED,
                          f"certificate refused: {exc}") from None


def peer_identity(context: grpc.ServicerContext, kind: str) -> Identity:
    """check_peer for a handler on a thread: a refused caller's call is aborted."""
    try:
        return check_peer(context, kind)
    except PeerRefused as exc:
        context.abort(exc.code, exc.details)
        raise  # abort raises; this line is never reached


async def peer_identity_async(context, kind: str) -> Identity:
    """check_peer for a handler on the event loop (whose context.abort is a coroutine); the
    caller its Gate admitted for this very call, if it did."""
    admitted = _ADMITTED.get()
    if admitted is not None and admitted[0] is context and admitted[1].kind == kind:
        return admitted[1]
    try:
        return check_peer(context, kind)
    except PeerRefused as exc:
        await context.abort(exc.code, exc.details)
        raise


class _Bucket:
    """A token bucket: `rate` calls a second on average, `burst` at once."""

    def __init__(self, limit: PeerLimit):
        self.rate, self.burst = limit.rate, float(limit.burst)
        self.tokens, self.at = self.burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def _logged(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - nobody awaits this; say what went wrong
        log.exception("could not write an audit entry")


def soon(fn: Callable[..., object], *args: object) -> None:
    """fn(*args) beside the event loop when called on it (an audit entry is a SQLite write),
    at once elsewhere. Nobody waits for it: a failure is logged."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _logged(fn, *args)
        return
    loop.run_in_executor(None, _logged, fn, *args)


class AuditThrottle:
    """Which refusals get an audit entry of their own: the first of a kind (certificate, call,
    target) in AUDIT_EVERY_S; the next entry of that kind says how many came in between."""

    def __init__(self, every_s: float = AUDIT_EVERY_S, most_kinds: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.every_s, self.most_kinds, self.clock = every_s, most_kinds, clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple, list[float]] = {}  # kind -> [last entry at, refusals since]

    def note(self, kind: tuple) -> str | None:
        """None: count this one, write nothing; else write an entry, with this suffix."""
        now = self.clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.every_s:
                seen[1] += 1
                return None
            if len(self._kinds) >= self.most_kinds:  # a bound, whatever the callers send
                self._kinds.clear()
            self._kinds[kind] = [now, 0]
        skipped = int(seen[1]) if seen is not None else 0
        return f" (and {skipped} more like it since the last entry)" if skipped else ""


def cert_note(fingerprint_: str) -> str:
    """How an audit entry names the certificate a call came with."""
    return f"[certificate sha256:{fingerprint_ or '?'}]"


class Gate:
    """Admits the calls of one service: `kind` certificates only, each within its limits.
    A refused certificate of another kind is an audit entry in `store`."""

    def __init__(self, service: str, kind: str, store=None,
                 limits: dict[str, PeerLimit] | None = None):
        self.service, self.kind, self.store = service, kind, store
        self.limits = limits or LIMITS
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], int] = {}
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._logged: dict[tuple[str, str, str], float] = {}
        self._audits = AuditThrottle()

    def enter(self, context, method: str) -> tuple[Identity, Callable[[], None]]:
        """(the caller, the release to call once when its call ends); PeerRefused if refused."""
        action = f"{self.service}.{method}"
        auth = context.auth_context()  # one call: it copies the certificate each time
        try:
            who = _peer(context, auth)
        except PeerRefused as exc:
            self._refused(None, auth, action, exc.details)
            raise
        key = (who.kind, who.name)
        limit = self.limits.get(who.kind, self.limits[self.kind])
        with self._lock:
            # the rate first: a flood of refused calls costs as little as possible
            bucket = self._buckets.get(key) or self._buckets.setdefault(key, _Bucket(limit))
            over_rate = not bucket.take()
            over_calls = not over_rate and self._open.get(key, 0) >= limit.calls
            if not (over_rate or over_calls or who.kind != self.kind):
                self._open[key] = self._open.get(key, 0) + 1
        if over_rate:
            self._warn(key, "rate", f"{who.name} is over {limit.rate:g} calls a second")
            raise PeerRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{who.name} made more than {limit.rate:g} calls a second (bursts "
                              f"of {limit.burst}); slow down and retry")
        if who.kind != self.kind:
            details = (f"{who.name} holds {_a(who.kind)} certificate; {action} needs "
                       f"{_a(self.kind)} certificate")
            self._refused(who, auth, action, details)
            raise PeerRefused(grpc.StatusCode.PERMISSION_DENIED, details)
        if over_calls:
            self._warn(key, "calls", f"{who.name} has {limit.calls} calls open")
            raise PeerRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{who.name} already has {limit.calls} calls open, the most one "
                              f"{who.kind} certificate may have; retry when one has ended")
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                with self._lock:
                    left = self._open.get(key, 1) - 1
                    if left > 0:
                        self._open[key] = left
                    else:
                        self._open.pop(key, None)

        return who, release

    async def admit(self, context, method: str) -> Callable[[], None]:
        """enter() for wire/guard.py: a refused call is aborted."""
        try:
            who, release = self.enter(context, method)
        except PeerRefused as exc:
            await context.abort(exc.code, exc.details)
            raise
        _ADMITTED.set((context, who))
        return release

    def open_calls(self, kind: str, name: str) -> int:
        with self._lock:
            return self._open.get((kind, name), 0)

    def _refused(self, who: Identity | None, auth: dict, action: str, details: str) -> None:
        name = who.name if who else "?"
        self._warn((who.kind if who else "?", name), action, f"refused {action}: {details}")
        fingerprint_ = peer_fingerprint(None, auth)
        suffix = self._audits.note((fingerprint_, action))
        if self.store is not None and suffix is not None:
            soon(self.store.audit, name, who.org if who else "", (who.role or "") if who else "",
                 "-", action, "-", "refused", f"{details}{suffix} {cert_note(fingerprint_)}")

    def _warn(self, key: tuple[str, str], reason: str, text: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._logged.get((*key, reason), -LOG_EVERY_S) < LOG_EVERY_S:
                return
            self._logged[(*key, reason)] = now
        log.warning("%s (more like it are not logged for %.0f s)", text, LOG_EVERY_S)
