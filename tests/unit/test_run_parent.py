"""A parent process keeps the system's OpenSSL out (run_parent._without_system_openssl), and
everything that needs a digest, an HMAC or Python's ssl still works in it."""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import sys
from atoll.run_parent import _without_system_openssl

_without_system_openssl()
import hashlib, hmac
assert "grpc" in sys.modules and "ssl" not in sys.modules
import asyncio.base_events
assert asyncio.base_events.ssl is None  # asyncio loaded with gRPC, without Python's ssl
maps = open("/proc/self/maps").read()
assert "libcrypto.so" not in maps, "the system OpenSSL is loaded"
# digests and HMACs come from CPython's own implementations, with the same results
assert hashlib.sha256(b"atoll").hexdigest() == (
    "71da85e98b12732faf66939f5c9980511f8a194400170602243265079a265efa")  # OpenSSL's answer
assert hmac.compare_digest(b"a", b"a") and not hmac.compare_digest(b"a", b"b")
mac = hmac.new(b"key", b"message", hashlib.sha256).hexdigest()
print(mac)
import pathlib, tempfile
from atoll.server.sessions import SessionSigner  # signs with HMAC-SHA256
signer = SessionSigner(pathlib.Path(tempfile.mkdtemp()) / "session.key")
token = signer.issue("admin@org", "study-a")
assert signer.verify(token, "admin@org") == "study-a"
assert signer.verify(token[:-2] + "xx", "admin@org") is None
# a launcher's client library that needs TLS later gets the real ssl module
import ssl
ssl.create_default_context()
print("ok")
"""


def test_parent_runs_without_system_openssl_and_ssl_still_imports_later():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    mac, ok = out.stdout.split()
    # RFC 2104 HMAC-SHA256 of "message" with key "key", computed with OpenSSL elsewhere
    assert mac == "6e9ef29b75fffc5b7abae527d58fdadb2fe42e7219011976917343065f58ed4a"
    assert ok == "ok"
