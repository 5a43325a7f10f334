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
    # The file's first bytes are the round's model, whole, as its own .safetensors file would
    # be (its SHA-256 is the round's model digest); 0: the state's document alone.
    model_bytes: int = 0

    def document(self) -> bytes:
        doc = {"format": FORMAT, "round": self.round, "file": self.file,
               "sha256": self.sha256, "bytes": self.bytes}
        if self.model_bytes:
            doc["model_bytes"] = self.model_bytes
        return json.dumps(doc, sort_keys=True).encode()


def state_file(round_: int) -> str:
    return f"round-{round_}.safetensors"


def parse_manifest(raw: bytes) -> Manifest:
    """The manifest in ``raw``; ValueError says what is wrong with it."""
    try:
        doc = json.loads(raw)
        round_, name, digest, size = doc["round"], doc["file"], doc["sha256"], doc["bytes"]
        model_bytes = doc.get("model_bytes", 0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"unexpected fields ({exc})") from None
    if (not isinstance(doc, dict) or doc.get("format") != FORMAT
            or not isinstance(round_, int) or isinstance(round_, bool) or round_ < 0
            or name != state_file(round_) or not isinstance(digest, str) or len(digest) != 64
            or not isinstance(size, int) or isinstance(size, bool) or size < 0
            or not isinstance(model_bytes, int) or isinstance(model_bytes, bool)
            or not (model_bytes == 0 or 0 < model_bytes < size)):
        raise ValueError("unexpected fields")
    return Manifest(round_, name, digest, size, model_bytes)
