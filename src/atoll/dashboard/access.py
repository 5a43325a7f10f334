"""Who may use the dashboard: whoever holds the URL it printed, once.

The URL carries a one-time token. Its first use is exchanged for a cookie (HttpOnly,
SameSite=Strict, random, known to this process only) and a redirect to the same page without
the token; a second use of the token is refused. Every request, static files and unknown paths
included, needs that cookie: without one it answers 401, with a wrong one (or a spent token)
403, and serves nothing else. A POST (abort) also needs an Origin of this very dashboard and
the CSRF token the page got from ``/api/me``. Bound to the loopback address, the Host header
must name it too (a page elsewhere cannot reach the dashboard by rebinding a DNS name).
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send


def cookie_name(port: int) -> str:
    """Cookies are kept per host, not per port: two dashboards on one machine need two names."""
    return f"atoll_dashboard_{port}"


CSRF_HEADER = "x-atoll-csrf"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
# What every answer carries: scripts and styles from this dashboard only (plotly adds inline
# styles), no framing, no referrer, nothing cached.
HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class Secrets:
    """The token printed once, the cookie it is exchanged for, the CSRF token of the pages."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)
        self.cookie = secrets.token_urlsafe(32)
        self.csrf = secrets.token_urlsafe(32)
        self.spent = False

    def exchange(self, token: str) -> bool:
        """True once, for the right token; it is spent then."""
        if self.spent or not hmac.compare_digest(token.encode(), self.token.encode()):
            return False
        self.spent = True
        return True

    def cookie_ok(self, value: str) -> bool:
        return hmac.compare_digest(value.encode(), self.cookie.encode())

    def csrf_ok(self, value: str) -> bool:
        return hmac.compare_digest(value.encode(), self.csrf.encode())


def _refuse(status: int, text: str) -> PlainTextResponse:
    return PlainTextResponse(f"{status}: {text}\n", status_code=status, headers=HEADERS)


class Access:
    """ASGI middleware in front of every route."""

    def __init__(self, app: ASGIApp, keys: Secrets, port: int, public: bool):
        self.app = app
        self.cookie = cookie_name(port)
        self.keys = keys
        self.port = port
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to guard
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        answer = self._check(request)
        if answer is not None:
            await answer(scope, receive, send)
            return

        async def with_headers(message):
            if message["type"] == "http.response.start":
                raw = message.setdefault("headers", [])
                have = {k.lower() for k, _ in raw}
                raw.extend((k.encode(), v.encode()) for k, v in HEADERS.items()
                           if k.encode() not in have)
            await send(message)

        await self.app(scope, receive, with_headers)

    def _check(self, request: Request):
        host = request.headers.get("host", "")
        if not self.public and host.rsplit(":", 1)[0] not in LOOPBACK:
            return _refuse(403, "this dashboard answers only at the address it printed")
        token = request.query_params.get("token")
        if token is not None:
            if not self.keys.exchange(token):
                return _refuse(403, "this link was used already or is wrong: start `atoll "
                                    "dashboard` again for a new one")
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items()
                              if k != "token"])
            answer = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), 303,
                                      headers=HEADERS)
            answer.set_cookie(self.cookie, self.keys.cookie, httponly=True, samesite="strict",
                              path="/")
            return answer
        cookie = request.cookies.get(self.cookie)
        if not cookie:
            return _refuse(401, "open the link `atoll dashboard` printed")
        if not self.keys.cookie_ok(cookie):
            return _refuse(403, "this browser's dashboard cookie is not this dashboard's")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin", "")
            if origin != f"http://{host}":
                return _refuse(403, "a change must come from the dashboard's own page")
            if not self.keys.csrf_ok(request.headers.get(CSRF_HEADER, "")):
                return _refuse(403, "a change must carry the dashboard page's token")
        return None
