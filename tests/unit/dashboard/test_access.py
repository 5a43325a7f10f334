"""The dashboard's door, on a real uvicorn server: without the cookie its one-time token buys,
every route answers 401 (none) or 403 (a wrong one) and serves nothing else; the token works
once; a change (abort) needs the page's own origin and CSRF token as well. Built for a public
listen (`--host ... --listen-public`), the door lets other host names through and holds the
rest alike."""

from __future__ import annotations

import contextlib
import http.client
import threading

import pytest
import uvicorn

from atoll.dashboard.access import Secrets, cookie_name
from atoll.dashboard.app import build
from atoll.dashboard.federation import Federation
from atoll.dashboard.serve import bind

JOB = "0123456789abcdef0123456789abcdef"
ROUTES = [("GET", "/"), ("GET", f"/jobs/{JOB}"), ("GET", "/static/dashboard.js"),
          ("GET", "/static/plotly.min.js"), ("GET", "/static/nope.js"), ("GET", "/api/me"),
          ("GET", "/api/overview"), ("GET", "/api/overview/stream"), ("GET", f"/api/jobs/{JOB}"),
          ("GET", f"/api/jobs/{JOB}/stream"), ("GET", f"/api/jobs/{JOB}/results"),
          ("GET", f"/api/jobs/{JOB}/provenance"), ("POST", f"/api/jobs/{JOB}/abort"),
          ("GET", "/no/such/route"), ("HEAD", "/")]


class NoServer:
    """Stands where the admin session is: the door must never let a request reach it."""

    def __getattr__(self, name):
        raise AssertionError(f"a refused request reached the federation ({name})")


@contextlib.contextmanager
def serve_door(public: bool):
    """The dashboard's app on a real uvicorn server, built for a loopback or a public listen
    (bound to the loopback either way: the public one is told so by the Host header)."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    keys = Secrets()
    app = build(Federation(NoServer()), keys, port, public=public)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    try:
        yield port, keys
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def dashboard():
    with serve_door(public=False) as door:
        yield door


# What a browser elsewhere sends to a dashboard on a shared machine's own address.
PUBLIC_HOST = "dashboard.example.org"


@pytest.fixture
def public_dashboard():
    with serve_door(public=True) as door:
        yield door


def ask(port, method, path, headers=None, host=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = dict(headers or {})
    if host is not None:
        headers["Host"] = f"{host}:{port}"
    conn.request(method, path, headers=headers)
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer.status, dict(answer.getheaders()), body


def refused_everywhere(port, method, path, host=None):
    status, headers, body = ask(port, method, path, host=host)
    assert status == 401, (status, body)
    assert method == "HEAD" or body.startswith(b"401: open the link")
    assert b"<" not in body and b"token=" not in body  # no page, no secret
    status, _, body = ask(port, method, path, {"Cookie": f"{cookie_name(port)}=forged"},
                          host=host)
    assert status == 403, (status, body)
    status, _, _ = ask(port, method, path + ("&" if "?" in path else "?") + "token=wrong",
                       host=host)
    assert status == 403
    assert headers["cache-control"] == "no-store" and "frame-ancestors 'none'" in headers[
        "content-security-policy"]


@pytest.mark.parametrize("method,path", ROUTES)
def test_without_a_cookie_every_route_is_401_and_with_a_wrong_one_403(dashboard, method, path):
    refused_everywhere(dashboard[0], method, path)


@pytest.mark.parametrize("method,path", ROUTES)
def test_listening_in_public_every_route_is_401_and_403_alike(public_dashboard, method, path):
    refused_everywhere(public_dashboard[0], method, path, host=PUBLIC_HOST)


def test_listening_in_public_the_token_still_works_once(public_dashboard):
    port, keys = public_dashboard
    status, headers, _ = ask(port, "GET", f"/?token={keys.token}", host=PUBLIC_HOST)
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(port)}={keys.cookie};") and "HttpOnly" in cookie
    status, _, body = ask(port, "GET", f"/?token={keys.token}", host=PUBLIC_HOST)
    assert status == 403 and b"used already" in body  # a second browser gets nothing
    status, _, body = ask(port, "GET", "/", {"Cookie": f"{cookie_name(port)}={keys.cookie}"},
                          host=PUBLIC_HOST)
    assert status == 200 and b'data-page="overview"' in body
    # a change still needs this dashboard's own origin (its public name) and the CSRF token
    abort = f"/api/jobs/{JOB}/abort"
    status, _, body = ask(port, "POST", abort, {"Cookie": f"{cookie_name(port)}={keys.cookie}",
                                                "Origin": "http://evil.example"},
                          host=PUBLIC_HOST)
    assert status == 403 and b"own page" in body


def test_the_token_buys_an_httponly_strict_cookie_once(dashboard):
    port, keys = dashboard
    status, headers, _ = ask(port, "GET", f"/?page=2&token={keys.token}")
    assert status == 303 and headers["location"] == "/?page=2"  # the token leaves the URL
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(port)}={keys.cookie};") and keys.token not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    status, _, body = ask(port, "GET", f"/?token={keys.token}")  # spent
    assert status == 403 and b"used already" in body
    status, headers, body = ask(port, "GET", "/static/dashboard.js",
                                {"Cookie": f"{cookie_name(port)}={keys.cookie}"})
    assert status == 200 and b"textContent" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    status, _, body = ask(port, "GET", "/", {"Cookie": f"{cookie_name(port)}={keys.cookie}"})
    assert status == 200 and b'data-page="overview"' in body
    assert keys.token.encode() not in body and keys.cookie.encode() not in body


def test_a_change_needs_the_dashboards_origin_and_csrf_token(dashboard):
    port, keys = dashboard
    cookie = {"Cookie": f"{cookie_name(port)}={keys.cookie}"}
    abort = f"/api/jobs/{JOB}/abort"
    for headers, why in [
            ({}, b"own page"),
            ({"Origin": "http://evil.example"}, b"own page"),
            ({"Origin": f"http://127.0.0.1:{port}"}, b"page's token"),
            ({"Origin": f"http://127.0.0.1:{port}", "X-Atoll-Csrf": "forged"}, b"page's token")]:
        status, _, body = ask(port, "POST", abort, {**cookie, **headers})
        assert status == 403 and why in body, (headers, body)
    status, _, _ = ask(port, "GET", abort, cookie)  # abort is a POST alone
    assert status == 405


def test_another_host_name_is_refused_on_the_loopback(dashboard):
    """A page elsewhere that rebinds its DNS name to 127.0.0.1 still sends its own Host."""
    port, keys = dashboard
    status, _, body = ask(port, "GET", f"/?token={keys.token}",
                          {"Host": f"attacker.example:{port}"})
    assert status == 403 and not keys.spent
