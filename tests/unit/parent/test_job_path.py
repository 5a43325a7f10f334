"""A parent loads its job path ahead of its first job, and nothing of that can fail it
(parent/job_path.py). Each case runs in a fresh interpreter: this one has the models already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from atoll.parent.local_config import load_local_config
from atoll.parent.local_record import RECORD_FILE

LOCAL = {
    "process": "launcher: process\nprocess: {sandbox: none}\n",
    "docker": "launcher: docker\ndocker: {default_image: atoll-worker:1.0}\n",
}

PROBE = textwrap.dedent("""
    import json, sys, threading
    from pathlib import Path
    from atoll.parent import job_path
    from atoll.parent.local_config import load_local_config

    role, folder = sys.argv[1], Path(sys.argv[2])
    local = load_local_config(folder / "local", False, folder / "workspace")
    local.launcher_name  # the check of local/ is done (its child may load what it likes)
    before = [m for m in ("pydantic", "yaml", "atoll.launchers.process") if m in sys.modules]
    raised = []
    threading.excepthook = lambda args: raised.append(repr(args.exc_value))
    job_path.warm_later(role, local, delay=0.01).join()
    print(json.dumps({"before": before, "made": local._launcher is not None, "raised": raised,
                      "loaded": all(m in sys.modules for m in job_path.MODULES[role]),
                      "docker": "docker" in sys.modules}))
""")


def _kit(tmp_path, site_yaml: str):
    local, workspace = tmp_path / "local", tmp_path / "workspace"
    local.mkdir()
    workspace.mkdir()
    (local / "site.yaml").write_text(site_yaml)
    return local, workspace


def _warm(tmp_path, role: str, site_yaml: str | None = None) -> dict:
    if site_yaml is not None:
        _kit(tmp_path, site_yaml)
    done = subprocess.run([sys.executable, "-c", PROBE, role, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["raised"] == []  # whatever fails, fails the job that needs it
    return seen


@pytest.mark.parametrize("role", ["server", "site"])
def test_the_job_path_and_the_process_launcher_are_loaded_ahead(tmp_path, role):
    seen = _warm(tmp_path, role, LOCAL["process"])
    assert seen["before"] == []  # nothing of it at rest before the warm-up
    assert seen["made"] and seen["loaded"] and not seen["docker"]


def test_a_launcher_that_cannot_be_made_fails_nothing_until_a_job_needs_it(tmp_path):
    """Beside a record the sandbox is probed after the start: a host where it cannot be made
    (here a record naming /bin/false as bwrap) fails the first launch, not the warm-up."""
    local, workspace = _kit(tmp_path, "launcher: process\n")
    load_local_config(local, False, workspace).launcher_name  # noqa: B018 - the record
    path = workspace / RECORD_FILE
    record = json.loads(path.read_text())
    record["values"]["sandbox"]["bwrap"] = "/bin/false"
    path.write_text(json.dumps(record))
    seen = _warm(tmp_path, "site")
    assert seen["loaded"] and not seen["made"]  # the modules, not the launcher


def test_other_launchers_come_with_their_first_job(tmp_path):
    """A docker or kubernetes client may dial its engine: not from a parent at rest."""
    seen = _warm(tmp_path, "site", LOCAL["docker"])
    assert seen["loaded"] and not seen["made"] and not seen["docker"]
