"""Shamir secret sharing of 32-byte secrets over the prime field GF(2**521 - 1).

Written here (about 40 lines) because the maintained Python libraries found share only 16-byte
secrets (PyCryptodome's ``Crypto.Protocol.SecretSharing``) or are unmaintained; the field is
the Mersenne prime 2**521 - 1, larger than any 256-bit secret, so one share is one element.
A secret is the constant term of a random polynomial of degree ``threshold - 1``; any
``threshold`` shares give it back by Lagrange interpolation at 0, fewer reveal nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

PRIME = 2**521 - 1
SECRET_BYTES = 32


def split(secret: bytes, xs: Sequence[int], threshold: int) -> dict[int, int]:
    """Shares of ``secret`` for the points ``xs`` (distinct, 1 <= x < PRIME): {x: y}."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a secret is {SECRET_BYTES} bytes, got {len(secret)}")
    if not 2 <= threshold <= len(xs):
        raise ValueError(f"threshold must be between 2 and {len(xs)} (the shares), got {threshold}")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and between 1 and PRIME - 1")
    coefficients = [int.from_bytes(secret, "big")] + [
        secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coefficients, x) for x in xs}


def _evaluate(coefficients: list[int], x: int) -> int:
    y = 0
    for c in reversed(coefficients):  # Horner
        y = (y * x + c) % PRIME
    return y


def combine(shares: Iterable[tuple[int, int]]) -> bytes:
    """The secret from ``threshold`` or more shares (x, y); a wrong or short set gives garbage,
    which the caller detects (a reconstructed key that does not match its public key)."""
    points = list(dict(shares).items())
    if len(points) < 2:
        raise ValueError("at least 2 shares are needed")
    secret = 0
    for i, (xi, yi) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                numerator = numerator * -xj % PRIME
                denominator = denominator * (xi - xj) % PRIME
        secret = (secret + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    if secret >= 1 << (8 * SECRET_BYTES):
        raise ValueError("the shares do not combine into a secret (too few, or not consistent)")
    return secret.to_bytes(SECRET_BYTES, "big")
