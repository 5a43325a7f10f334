"""Where jobs' run folders live: the one rule, for the running parents and ``atoll site render``.

A site's run folders are ``<root>/jobs/<job id>``, where root is

- ``slurm.workspace`` on a Slurm site (the folder its compute nodes see: a shared file system,
  while the kit with its key stays on the parent's own disk),
- ``process.workdir`` on a process site,
- else the kit's workspace (kit.yaml's ``workspace``; ``<kit>/workspace`` by default).

Relative settings are relative to the kit folder (``SiteConfig.resolve_path``). The server
parent's workflow runs in ``<workspace>/jobs/<job id>/run/server`` (``server_run_folder``), beside
the job's stored files in ``<workspace>/jobs/<job id>/job``.

The site parent makes the folders it needs under root with ``private_dir``; the folder a job is
fetched and checked in before it becomes its run folder is under root too (``fetch_scratch``),
so that an accepted job is renamed into place on the same file system.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

JOBS = "jobs"
FETCH_SCRATCH = ".fetching"  # under root: a job being fetched and checked, not yet accepted


def runs_setting(site_config: Any) -> str | None:
    """site.yaml's own word on where run folders go (process.workdir, slurm.workspace), as
    written; None: the workspace."""
    settings = site_config.settings
    if site_config.launcher == "slurm":
        return settings.workspace or None
    if site_config.launcher == "process":
        return settings.workdir or None
    return None


def resolve_runs_root(setting: str | None, kit_dir: Path | None, workspace: Path) -> Path:
    """The folder holding ``jobs/`` for a setting: absolute as is, relative to the kit folder
    (as every path of site.yaml), none: the workspace. Pure: a parent at rest uses it with the
    setting its check recorded, without loading the SiteConfig."""
    if not setting:
        return Path(workspace)
    path = Path(setting).expanduser()
    return path if path.is_absolute() or kit_dir is None else kit_dir / path


def runs_root(site_config: Any, workspace: Path) -> Path:
    """The folder holding this site's ``jobs/``: the launcher's setting, else ``workspace``."""
    chosen = runs_setting(site_config)
    return site_config.resolve_path(chosen) if chosen else Path(workspace)


def run_folder(site_config: Any, workspace: Path, job_id: str) -> Path:
    """A site job's run folder: what its worker gets as its working folder."""
    return runs_root(site_config, workspace) / JOBS / job_id


def fetch_scratch(site_config: Any, workspace: Path) -> Path:
    """Where a dispatched job is fetched and checked before it becomes a run folder."""
    return runs_root(site_config, workspace) / FETCH_SCRATCH


def server_run_folder(workspace: Path, job_id: str) -> Path:
    """The server job worker's run folder (server/jobs.py should call this, not join paths)."""
    return Path(workspace) / JOBS / job_id / "run" / "server"
