"""Launch requests built from FLARE-format inputs, the way a site parent builds them.

Each compat case names the NVIDIA FLARE 2.9 behaviour it checks (the module and function of
FLARE's own code, or its doc) in its id; tests compare atoll's native render with the value
FLARE renders for the same input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atoll.launchers.base import JobIdentity
from atoll.launchers.request import build_request
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime

JOB_ID = "0123456789abcdef0123456789abcdef"
SITE = "site-1"
STUDY = "lung"
SITE_SETTINGS: dict[str, dict[str, Any]] = {
    "docker": {"default_image": "registry.example.com/nvflare-job:2.9",
               "gpu_ids": [0, 1, 2, 3]},  # the host's GPUs: each job gets its own ids
    "k8s": {"namespace": "fl-jobs", "host_network": True,
            "default_image": "registry.example.com/nvflare-job:2.9"},
    "slurm": {"partition": "gpu"},
    "process": {"sandbox": "none"},
}
PARENT = {"docker": "127.0.0.1:7001", "k8s": "127.0.0.1:7001",
          "slurm": "login1.example.org:7001", "process": "127.0.0.1:7001"}


def flare_request(
    backend: str,
    *,
    resource_spec: dict[str, Any] | None = None,
    launcher_spec: dict[str, Any] | None = None,
    study: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    workdir: Path = Path("/srv/atoll/jobs") / JOB_ID,
) -> Any:
    """A LaunchRequest for ``site-1`` of a job whose meta.json carries the given FLARE blocks."""
    site_config = parse_site_config(
        {"launcher": backend, backend: SITE_SETTINGS[backend] if settings is None else settings}
    )
    runtime = parse_study_runtime(
        {"format_version": 2, "studies": {STUDY: study or {}}}, backend
    )
    meta = load_meta({
        "name": "flare-job",
        "deploy_map": {"app": ["@ALL"]},
        "resource_spec": resource_spec or {},
        "launcher_spec": launcher_spec or {},
    })
    return build_request(
        meta=meta,
        identity=JobIdentity(JOB_ID, "flare-job", STUDY, SITE, "site"),
        site_config=site_config,
        study_runtime=runtime,
        workdir=workdir,
        parent_address=PARENT[backend],
        credentials={"ATOLL_JOB_TOKEN": "tok"},
        check_capacity=False,
    )


def site_block(backend: str, **values: Any) -> dict[str, Any]:
    """``launcher_spec`` with one block for site-1 and ``backend``."""
    return {SITE: {backend: values}}
