"""The primitives of secure aggregation, all from ``cryptography``: X25519 key agreement,
HKDF-SHA256, AES-256-GCM for the shares in transit, and AES-256-CTR as the pseudo-random
generator that expands a 32-byte seed into a mask of 32- or 64-bit words.

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
_BLOCK_BYTES = 1 << 20  # mask bytes made per AES call
_STREAM_LIMIT = 1 << 64  # streams, and AES blocks per stream: the counter block's two halves


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


def counter_block(stream: int) -> bytes:
    """The initial CTR counter block of mask stream ``stream``: the stream number in the high
    64 bits, the block counter from 0 in the low 64. Streams of one seed never reach each
    other's blocks (a stream is far below 2**64 blocks), so no two masks share keystream; a
    stream number as the whole initial block would make stream s+1 stream s shifted by one."""
    if not 0 <= stream < _STREAM_LIMIT:
        raise ValueError(f"mask stream {stream} outside 0..2**64-1")
    return (stream << 64).to_bytes(16, "big")


def add_mask(target: np.ndarray, seed: bytes, stream: int, sign: int) -> None:
    """Add (sign 1) or subtract (-1) ``seed`` expanded into words of ``target``'s width to
    ``target`` (a C-contiguous uint32 or uint64 array) in place, modulo 2**32 or 2**64:
    AES-256-CTR from ``counter_block(stream)`` (each parameter of a model has its own stream).
    The mask is made block by block into one small buffer, never whole."""
    flat = target.reshape(-1)
    if flat.dtype not in (np.uint32, np.uint64):
        raise TypeError(f"masks are added to uint32 or uint64 words, not {flat.dtype}")
    size = flat.dtype.itemsize
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(counter_block(stream))).encryptor()
    per_block = _BLOCK_BYTES // size
    block = min(len(flat), per_block)
    zeros = memoryview(bytes(block * size))
    scratch = bytearray(block * size + 15)  # update_into wants room for one more AES block
    combine = np.add if sign > 0 else np.subtract
    for start in range(0, len(flat), per_block):
        count = min(per_block, len(flat) - start)
        encryptor.update_into(zeros[:count * size], scratch)
        part = flat[start:start + count]
        combine(part, np.frombuffer(scratch, flat.dtype, count), out=part)


def expand(seed: bytes, stream: int, shape: tuple[int, ...],
           dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
    """``seed``'s mask of ``shape`` as an array (what ``add_mask`` adds)."""
    out = np.zeros(shape, dtype=dtype)
    add_mask(out, seed, stream, 1)
    return out
