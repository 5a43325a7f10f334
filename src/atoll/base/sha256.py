"""SHA-256 of large inputs (a final model, a checkpoint, a container image) in any process.

A parent keeps the system's OpenSSL out of its memory at rest (parent/run.py), so its
``hashlib.sha256`` is CPython's built-in implementation: 0.34 CPU-s per 100 MiB here, against
0.06 for OpenSSL's (SHA-NI). A digest of many MiB therefore loads OpenSSL's (4.5 MiB of
libcrypto, once): a 1 GiB final model's digest at a job's end takes 0.6 s, not 3.5. A small one
(a tiny job's model: 1 ms either way) leaves OpenSSL out.
"""

from __future__ import annotations

import sys
from typing import Any

LARGE = 8 * 1024 * 1024  # from here OpenSSL's saves more than 20 ms


def openssl_out_at_rest() -> None:
    """hashlib without OpenSSL in this process until ``sha256_for`` meets a large input (call
    it before anything imports hashlib): a parent, a verifier."""
    sys.modules.setdefault("_hashlib", None)


def sha256_for(size: int) -> Any:
    """A new SHA-256 object (``update``, ``hexdigest``) for ``size`` bytes: OpenSSL's for a
    large input where this Python has it, else hashlib's."""
    import hashlib  # not at import: openssl_out_at_rest comes first

    if size < LARGE:
        return hashlib.sha256()
    if "_hashlib" in sys.modules and sys.modules["_hashlib"] is None:
        del sys.modules["_hashlib"]  # only hashlib's own import was told it is absent
    try:
        import _hashlib
    except ImportError:
        return hashlib.sha256()
    return _hashlib.openssl_sha256()
