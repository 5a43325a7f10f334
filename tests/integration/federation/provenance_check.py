"""For the federation tests on the real engines: a finished job's provenance record, exported
with `atoll job provenance` and verified offline (`atoll provenance verify`) with the project's
CA certificate alone, and one site's launch entry from it (naming its render's digest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.federation.harness import Federation


def atoll(*args: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atoll", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def verified_launch_entry(fed: Federation, admin: str, job_id: str, site: str,
                          tmp: Path, study: str | None = None) -> dict[str, Any]:
    """The site.launch body `site` signed in the job's record, once the whole record verified."""
    record = tmp / f"provenance-{job_id}.json"
    done = atoll("job", "provenance", job_id, "--out", record, "--kit", fed.kit(admin),
                 *(["--study", study] if study else []))
    assert done.returncode == 0, done.stdout + done.stderr
    ca = fed.kit(admin) / "startup" / "rootCA.pem"
    done = atoll("provenance", "verify", record, "--ca", ca, "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    entries = [json.loads(e["entry"]) for e in json.loads(record.read_text())["entries"]]
    launches = [e["body"] for e in entries
                if e["kind"] == "site.launch" and e["by"] == {"kind": "site", "name": site}]
    assert len(launches) == 1, entries
    # what the site's launcher rendered for the job, by its digest (launchers/base.py)
    assert launches[0]["render_digest"].startswith("sha256:"), launches[0]
    return launches[0]
