"""A record that a parent's ``local/`` passed the check, so an unchanged folder is not checked
again at every start.

Checking ``site.yaml`` and ``study_runtime.yaml`` costs a parent about 0.2 CPU-seconds at start
(pydantic and the spec models, in a forked child: local_config.py), the larger part of what a
parent does before it is ready. The record, ``<workspace>/local-checked.json``, holds the values
the parent keeps at rest (launcher, capacity, worker endpoint) and a fingerprint: sha256 over
atoll's version, which files were checked, and the name and bytes of every file under
``local/``. Any edit, added file or upgrade of atoll changes the fingerprint, and the next start
checks the folder in full. The check writes the record after it passed; ``atoll provision``
writes it for the files it generates. Whoever can write the workspace can already change what
the parent does, so the record is trusted as far as the workspace is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from atoll import __version__

RECORD_FILE = "local-checked.json"
# local/ holds a few small YAML files; past this much, hashing it at every start is not worth it.
MAX_HASHED_BYTES = 4 * 1024 * 1024


def fingerprint(local_dir: Path, study_runtime: bool) -> tuple[str, bytes] | None:
    """The folder's fingerprint and the bytes of its site.yaml as read for it; None when the
    folder cannot be read or is too large to hash at every start."""
    digest = hashlib.sha256(f"atoll {__version__}\0study_runtime={study_runtime}\0".encode())
    site_yaml = b""
    total = 0
    try:
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        for path in files:
            data = path.read_bytes()
            total += len(data)
            if total > MAX_HASHED_BYTES:
                return None
            name = path.relative_to(local_dir).as_posix()
            if name == "site.yaml":
                site_yaml = data
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
    except OSError:
        return None
    return digest.hexdigest(), site_yaml


def read_record(workspace: Path, print_: str) -> dict[str, Any] | None:
    """The values a record holds for the fingerprint ``print_``; None when there is no record,
    it is for other contents, or it cannot be read."""
    try:
        record = json.loads((workspace / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != print_:
        return None
    values = record.get("values")
    return values if isinstance(values, dict) else None


def write_record(workspace: Path, print_: str, values: dict[str, Any]) -> None:
    """Record that the contents with fingerprint ``print_`` passed the check. Best effort: a
    parent that cannot write its workspace checks in full at the next start."""
    from atoll.base.files import PRIVATE, write_atomic

    text = json.dumps({"fingerprint": print_, "values": values}, indent=2) + "\n"
    try:
        workspace.mkdir(parents=True, exist_ok=True)
        write_atomic(workspace / RECORD_FILE, text, PRIVATE)  # the workspace is the parent's
    except OSError:
        pass
