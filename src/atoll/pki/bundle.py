"""The signed bundle: what the project admin sends back for a signing request.

One JSON file, ``<name>.signed.json``, with everything a participant needs to assemble its
kit around the key it kept: its certificate, the project's root CA, where the server is. It
holds no private key, so it may travel by any channel; the participant checks the root CA's
fingerprint with the one the project admin published before trusting it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atoll.base.files import PUBLIC, write_atomic
from atoll.pki.state import ProvisionError

FORMAT = "atoll-signed-request"
FORMAT_VERSION = 1
SUFFIX = ".signed.json"


@dataclass(frozen=True)
class Bundle:
    project: str
    name: str
    kind: str  # site | admin
    org: str
    role: str | None
    server_host: str
    server_port: int
    certificate: str  # PEM
    root_ca: str  # PEM


def write_bundle(bundle: Bundle, path: Path) -> None:
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(bundle)}
    write_atomic(path, json.dumps(doc, indent=2) + "\n", PUBLIC)


def load_bundle(path: Path) -> Bundle:
    """The bundle in ``path``; ProvisionError names the file and what is wrong with it."""
    try:
        doc: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"cannot read the signed bundle {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or \
            doc.get("format_version") != FORMAT_VERSION:
        raise ProvisionError(f"{path} is not a signed bundle of `atoll provision sign` "
                             f"(format {FORMAT} {FORMAT_VERSION})")
    types = {"project": str, "name": str, "kind": str, "org": str, "server_host": str,
             "server_port": int, "certificate": str, "root_ca": str}
    wrong = [key for key, kind in types.items() if not isinstance(doc.get(key), kind)]
    if doc.get("role") is not None and not isinstance(doc["role"], str):
        wrong.append("role")
    if wrong:
        raise ProvisionError(f"{path}: missing or malformed {', '.join(wrong)}; ask the project "
                             "admin to sign the request again")
    return Bundle(**{key: doc.get(key) for key in (*types, "role")})
