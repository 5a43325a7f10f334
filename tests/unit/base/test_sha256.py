"""Large digests in a parent use OpenSSL's SHA-256, though the parent keeps it out at rest."""

import hashlib
import subprocess
import sys

PARENT_AT_REST = """
import sys
from atoll.base.sha256 import openssl_out_at_rest
openssl_out_at_rest()  # as parent/run.py starts a parent
import hashlib
print(type(hashlib.sha256()).__module__)
from atoll.base.sha256 import LARGE, sha256_for
small = sha256_for(LARGE - 1)
print(type(small).__module__, "_hashlib" in sys.modules and sys.modules["_hashlib"] is not None)
h = sha256_for(LARGE)
h.update(b"atoll" * 100_000)
print(type(h).__module__, h.hexdigest())
print(type(hashlib.sha256()).__module__)  # hashlib itself is left as it was
"""


def test_a_parent_at_rest_digests_a_large_file_with_openssl():
    out = subprocess.run([sys.executable, "-c", PARENT_AT_REST], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "_sha256"  # without OpenSSL at rest: CPython's built-in SHA-256
    assert out[1:3] == ["_sha256", "False"]  # a small digest leaves OpenSSL out
    assert out[3] == "_hashlib"  # loaded for the large digest
    assert out[4] == hashlib.sha256(b"atoll" * 100_000).hexdigest()
    assert out[5] == "_sha256"


def test_the_digest_is_sha256():
    from atoll.base.sha256 import LARGE, sha256_for

    for size in (0, LARGE):
        h = sha256_for(size)
        h.update(b"abc")
        assert h.hexdigest() == hashlib.sha256(b"abc").hexdigest()
