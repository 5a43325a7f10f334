"""The provenance record's one-time cost in a parent: cryptography loaded and its first ECDSA
signature (a parent at rest has neither), then the cost of each further signature.

    .venv/bin/python bench/provenance_sign_cost.py
"""

from __future__ import annotations

import importlib
import resource
import time

import atoll.server.app  # noqa: F401 - a parent's own imports, as at rest
import atoll.site.supervisor  # noqa: F401


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    t0, w0 = cpu(), time.perf_counter()
    importlib.import_module("atoll.pki.provenance")
    ec = importlib.import_module("cryptography.hazmat.primitives.asymmetric.ec")
    hashes = importlib.import_module("cryptography.hazmat.primitives.hashes")
    for name in ("cryptography.x509", "cryptography.hazmat.primitives.serialization"):
        importlib.import_module(name)  # a kit's key and certificate are read as PEM
    key = ec.generate_private_key(ec.SECP256R1())
    key.sign(b"x", ec.ECDSA(hashes.SHA256()))
    t1, w1 = cpu(), time.perf_counter()
    for _ in range(100):
        key.sign(b"x" * 500, ec.ECDSA(hashes.SHA256()))
    t2 = cpu()
    print(f"first use (import + first signature): {1000 * (t1 - t0):.0f} CPU-ms, "
          f"{1000 * (w1 - w0):.0f} ms wall; one more signature: {10 * (t2 - t1):.2f} CPU-ms")


if __name__ == "__main__":
    main()
