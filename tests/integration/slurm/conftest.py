"""The real Slurm of scripts/backends/slurm.sh, and a SlurmLauncher wired to it.

Start it once with ``scripts/backends/slurm.sh up`` (about 15 s, plus the package install on a
fresh machine). Without it these tests skip, or fail when ``CI=true``. Every job of a test
session runs for the study ``SESSION_STUDY``, which its ``--comment`` carries; at the end of the
session every such job still queued is cancelled, and the session fails if one stays.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atoll.launchers.base import JobIdentity, LaunchRequest
from atoll.launchers.slurm import SlurmLauncher
from atoll.spec.resources import Resources
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "backends" / "slurm.sh"
BASE = Path(os.environ.get("ATOLL_SLURM_BASE", "/tmp/atoll-slurm"))
SESSION_STUDY = f"t{uuid.uuid4().hex[:10]}"
SITE = "slurm-site"
PYTHON = os.environ.get("ATOLL_TEST_PYTHON", str(REPO / ".venv" / "bin" / "python"))


def session_jobs() -> list[str]:
    """Live jobs of this test session (their comment names the session's study)."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True, check=True
    ).stdout
    return [
        line.split("|")[0]
        for line in out.splitlines()
        if f"study={SESSION_STUDY} " in line.split("|", 1)[-1] + " "
    ]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        why = f"no test Slurm ({status.stderr.strip()}); start it: {SCRIPT} up"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(BASE / "etc" / "slurm.conf")
    yield BASE
    left = session_jobs()
    if left:
        subprocess.run(["scancel", *left], capture_output=True)
        deadline = time.monotonic() + 15
        while (left := session_jobs()) and time.monotonic() < deadline:
            time.sleep(0.2)
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    assert not left, f"Slurm jobs of this test session left in the queue: {left}"


def slurm_site(**slurm: Any) -> Any:
    settings = {"python_path": PYTHON, "pending_timeout": 60, **slurm}
    return parse_site_config({"launcher": "slurm", "slurm": settings})


def study_entry(**entry: Any) -> Any:
    runtime = parse_study_runtime({"format_version": 2, "studies": {SESSION_STUDY: entry}}, "slurm")
    return runtime.entry(SESSION_STUDY)


def make_request(
    workdir: Path,
    program: str,
    *,
    site_config: Any = None,
    study: Any = None,
    resources: Resources | None = None,
    launcher_spec: dict[str, Any] | None = None,
    credentials: dict[str, str] | None = None,
) -> LaunchRequest:
    """A request whose worker runs ``<python> -c program`` under the launcher's rules."""
    job_id = uuid.uuid4().hex
    identity = JobIdentity(job_id, "slurm-it", SESSION_STUDY, SITE, "site")
    parent = "127.0.0.1:9"
    return LaunchRequest(
        identity=identity,
        resources=resources or Resources(num_of_gpus=0, num_of_cpus=1, memory="128Mi"),
        launcher_spec=launcher_spec or {},
        study_runtime=study,
        site_config=site_config or slurm_site(),
        workdir=workdir,
        parent_address=parent,
        worker_env={
            "ATOLL_JOB_ID": job_id,
            "ATOLL_ROLE": "site",
            "ATOLL_SITE": SITE,
            "ATOLL_STUDY": SESSION_STUDY,
            "ATOLL_PARENT": parent,
        },
        credentials={"ATOLL_JOB_TOKEN": f"token-{job_id}", **(credentials or {})},
        worker_args=("-c", program),
    )


@pytest.fixture
def launcher(slurm_cluster: Path) -> Iterator[SlurmLauncher]:
    launcher = SlurmLauncher(slurm_site())
    yield launcher
    launcher.close()


def scontrol_job(native_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as a dict (values without spaces only, which is all we read)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", native_id], capture_output=True, text=True, check=True
    ).stdout
    fields = {}
    for word in out.split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields
