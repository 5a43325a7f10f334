"""A parent process keeps the system's OpenSSL out (parent/run.py: _without_system_openssl), and
everything that needs a digest, an HMAC or Python's ssl still works in it. It reads a kit as
provisioned in its own process, from kit.json, and an edited one in a forked child: PyYAML stays
out either way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from atoll.pki.project import parse_project
from atoll.pki.provision import provision

PROBE = r"""
import sys
from atoll.parent.run import _without_system_openssl

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


KIT_PROBE = r"""
import sys
from pathlib import Path
import atoll.parent.forked
forked = []
def run_forked(fn, *args):
    forked.append(fn.__name__)
    return real(fn, *args)
real, atoll.parent.forked.run_forked = atoll.parent.forked.run_forked, run_forked
from atoll.parent.run import run
code = run("server", Path(sys.argv[1]), None, False)  # a site kit: refused once it is read
print(code, forked, "yaml" in sys.modules)
"""


def test_a_parent_reads_a_provisioned_kit_itself_and_an_edited_one_in_a_child(tmp_path: Path):
    project = parse_project({"name": "p", "server": {"name": "server", "host": "127.0.0.1",
                                                     "port": 8443},
                             "sites": [{"name": "site-1", "org": "o"}]})
    kit = provision(project, tmp_path).project_dir / "site-1"

    def start() -> tuple[str, str]:
        out = subprocess.run([sys.executable, "-c", KIT_PROBE, str(kit)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip(), out.stderr

    stdout, stderr = start()
    assert stdout == "2 [] False"  # read in this process, no fork, no PyYAML
    assert "is a site kit; `atoll server start` needs a server's kit" in stderr
    kit_yaml = kit / "startup" / "kit.yaml"
    kit_yaml.write_text(kit_yaml.read_text().replace("port: 8443", "port: 9443"))
    stdout, stderr = start()
    assert stdout == "2 ['load_kit'] False"  # parsed in a forked child; PyYAML stayed there
    assert "is a site kit" in stderr
