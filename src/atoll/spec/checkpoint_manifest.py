"""A workflow checkpoint's commit point, ``checkpoint.json``: which state file holds the state of
which round, with its SHA-256 and size (atoll.fl.checkpoint writes and reads it).

One rule for everyone who reads one: the server worker that restores from it, and a server
parent that keeps a checkpoint a Pod sent home (wire/checkpoint_home.py) and checks it before
it replaces the one it held. Pure: no I/O, nothing imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FORMAT = 1
MANIFEST = "checkpoint.json"


@dataclass(frozen=True)
class Manifest:
    round: int
    file: str  # round-<round>.safetensors, beside the manifest
    sha256: str
    bytes: int

    def document(self) -> bytes:
        return json.dumps({"format": FORMAT, "round": self.round, "file": self.file,
                           "sha256": self.sha256, "bytes": self.bytes}, sort_keys=True).encode()


def state_file(round_: int) -> str:
    return f"round-{round_}.safetensors"


def parse_manifest(raw: bytes) -> Manifest:
    """The manifest in ``raw``; ValueError says what is wrong with it."""
    try:
        doc = json.loads(raw)
        round_, name, digest, size = doc["round"], doc["file"], doc["sha256"], doc["bytes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unexpected fields ({exc})") from None
    if (not isinstance(doc, dict) or doc.get("format") != FORMAT
            or not isinstance(round_, int) or isinstance(round_, bool) or round_ < 0
            or name != state_file(round_) or not isinstance(digest, str) or len(digest) != 64
            or not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise ValueError("unexpected fields")
    return Manifest(round_, name, digest, size)
