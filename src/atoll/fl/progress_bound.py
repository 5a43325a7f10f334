"""A workflow's progress event cut to what the server takes: with thousands of sites, a round's
per-site entries ("sites", "failed", "active") outgrow the 64 KiB a worker's report may be
(wire/bodies.py MAX_WORKER_BODY), and a refused report failed the job (bench/scale.py at 3,000
sites). The first entries are kept and the event says how many were left out; the whole
per-site record stays in the job's results (the workflow writes it there)."""

from __future__ import annotations

import json
from typing import Any

MAX_REPORT_BYTES = 60 * 1024  # under the parent's 64 KiB, with room for the envelope
PER_SITE_KEYS = ("sites", "failed", "active")


def bounded(event: dict[str, Any], max_bytes: int = MAX_REPORT_BYTES) -> dict[str, Any]:
    """``event`` itself when it fits; else a copy whose per-site entries are cut to fit, each
    cut key counted in ``<key>_omitted``."""
    size = len(json.dumps(event))
    if size <= max_bytes:
        return event
    out = dict(event)
    for key in PER_SITE_KEYS:
        value = out.get(key)
        if not isinstance(value, dict | list) or not value:
            continue
        others = len(json.dumps({k: v for k, v in out.items() if k != key}))
        room = max_bytes - others - 64  # the key, the count of those left out
        items = list(value.items()) if isinstance(value, dict) else list(value)
        kept, used = 0, 2
        for item in items:
            used += len(json.dumps(dict([item]) if isinstance(value, dict) else [item])) + 1
            if used > room:
                break
            kept += 1
        out[key] = dict(items[:kept]) if isinstance(value, dict) else items[:kept]
        out[f"{key}_omitted"] = len(items) - kept
        if len(json.dumps(out)) <= max_bytes:
            return out
    # what is left is not per site: keep only the plain fields
    return {k: v for k, v in out.items()
            if isinstance(v, str | int | float | bool) or v is None}
