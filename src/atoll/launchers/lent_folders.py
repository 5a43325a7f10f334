"""Host folders a launcher lends to a job (datasets, secret mounts) are never the parent's own.

The Docker launcher (binds) and the process launcher (the sandbox's mounts, or the paths an
unconfined worker is told) check every lent folder here at launch, however the request was made;
study_runtime.yaml was checked with the same rule (spec/kit_paths.py) when it was loaded.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from atoll.launchers.base import LaunchError, LaunchRequest
from atoll.spec.kit_paths import kit_bind_problem


def refuse_parent_folders(source: PurePosixPath, request: LaunchRequest, where: str) -> None:
    """The site kit (keys, local/, every run folder) and the folder of all run folders stay
    the parent's: a lent folder may not be, hold or (the kit) lie inside them."""
    kit = request.site_config.kit_dir
    jobs = PurePosixPath(request.workdir).parent
    problem = kit_bind_problem(source, PurePosixPath(kit)) if kit else None
    if problem is None and (source == jobs or source in jobs.parents):
        problem = f"{source} would show the job {jobs}, the folder of every job's run folder"
    if problem:
        raise LaunchError(f"local/study_runtime.yaml: {where}: {problem}")
