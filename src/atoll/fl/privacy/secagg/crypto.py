"""The primitives of secure aggregation, all from ``cryptography``: X25519 key agreement,
HKDF-SHA256, AES-256-GCM for the shares in transit, and AES-256-CTR as the pseudo-random
generator that expands a 32-byte seed into a mask of 64-bit words.

Every derived key is bound to the job, the round and the pair of sites (HKDF's ``info``), so
a key or mask of one round is never reused in another.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from atoll.spec.errors import AtollError

SEED_BYTES = 32
_RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
_BLOCK_WORDS = 1 << 17  # mask words made per AES call (1 MiB)


class ShareDecryptError(AtollError, ValueError):
    """An encrypted share did not decrypt: changed in transit or not meant for this site."""


@dataclass(frozen=True)
class KeyPair:
    private: bytes  # raw X25519 private key (32 bytes): never leaves the site, except as shares
    public: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        key = X25519PrivateKey.generate()
        private = key.private_bytes(serialization.Encoding.Raw,
                                    serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        return cls(private, key.public_key().public_bytes(*_RAW))


def public_of(private: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(*_RAW)


def agree(private: bytes, peer_public: bytes, info: str) -> bytes:
    """A 32-byte key both ends derive: HKDF-SHA256 over X25519(private, peer_public)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None,
                info=info.encode()).derive(shared)


def encrypt(key: bytes, plaintext: bytes, aad: str) -> str:
    nonce = os.urandom(12)
    return base64.b64encode(nonce + AESGCM(key).encrypt(nonce, plaintext, aad.encode())).decode()


def decrypt(key: bytes, token: str, aad: str) -> bytes:
    try:
        raw = base64.b64decode(token, validate=True)
        return AESGCM(key).decrypt(raw[:12], raw[12:], aad.encode())
    except (InvalidTag, ValueError) as exc:
        raise ShareDecryptError(f"an encrypted share does not decrypt ({aad})") from exc


def new_seed() -> bytes:
    return os.urandom(SEED_BYTES)


def add_mask(target: np.ndarray, seed: bytes, stream: int, sign: int) -> None:
    """Add (sign 1) or subtract (-1) ``seed`` expanded into uint64 words to ``target`` (a
    C-contiguous uint64 array) in place, modulo 2**64: AES-256-CTR with the stream number
    ``stream`` as the initial counter block (each parameter of a model has its own stream).
    The mask is made block by block into one small buffer, never whole."""
    flat = target.reshape(-1)
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(stream.to_bytes(16, "big"))).encryptor()
    block = min(len(flat), _BLOCK_WORDS)
    zeros = memoryview(bytes(block * 8))
    scratch = bytearray(block * 8 + 15)  # update_into wants room for one more AES block
    combine = np.add if sign > 0 else np.subtract
    for start in range(0, len(flat), _BLOCK_WORDS):
        count = min(_BLOCK_WORDS, len(flat) - start)
        encryptor.update_into(zeros[:count * 8], scratch)
        part = flat[start:start + count]
        combine(part, np.frombuffer(scratch, np.uint64, count), out=part)


def expand(seed: bytes, stream: int, shape: tuple[int, ...]) -> np.ndarray:
    """``seed``'s mask of ``shape`` as an array (what ``add_mask`` adds)."""
    out = np.zeros(shape, dtype=np.uint64)
    add_mask(out, seed, stream, 1)
    return out
