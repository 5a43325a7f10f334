"""Study-scoped admin sessions: a token the server signs at login and checks on every call.

The token binds a user (the certificate's name) to a study until it expires. It is not a
credential on its own: every call still needs the user's certificate, and the token is only
accepted from the user it names.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TTL_S = 12 * 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Grant:
    """What a token this server signed for the caller says: its study, and if it has expired."""

    study: str
    expired: bool


class SessionSigner:
    def __init__(self, key_path: Path):
        if not key_path.exists():
            key_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
        self._key = key_path.read_bytes()

    def issue(self, user: str, study: str, ttl_s: int = DEFAULT_TTL_S) -> str:
        payload = _b64(json.dumps({"u": user, "s": study, "exp": int(time.time()) + ttl_s}).encode())
        return f"v1.{payload}.{self._sign(payload)}"

    def verify(self, token: str, user: str) -> str | None:
        """The study the token grants to `user`, or None if it is invalid, expired or not theirs."""
        grant = self.check(token, user)
        return grant.study if grant is not None and not grant.expired else None

    def check(self, token: str, user: str) -> Grant | None:
        """The token's grant, expired or not; None if this server did not sign it for `user`
        (altered, forged, another user's): such a call is refused before its request is read."""
        try:
            version, payload, signature = token.split(".")
            if version != "v1" or not hmac.compare_digest(signature, self._sign(payload)):
                return None
        except (ValueError, TypeError):  # not three parts; not ASCII
            return None
        try:
            body = json.loads(_unb64(payload))
        except ValueError:
            return None
        if not isinstance(body, dict) or body.get("u") != user or \
                not isinstance(body.get("s"), str):
            return None
        expires = body.get("exp", 0)
        return Grant(body["s"], not isinstance(expires, int | float) or expires < time.time())

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())
