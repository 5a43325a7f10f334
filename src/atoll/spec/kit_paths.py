"""Whether a host folder lent to a job would show it the site kit (keys, settings, run folders).

One rule for every launcher that lends host folders (docker binds, the process sandbox's
mounts), used where study_runtime.yaml is loaded (links followed) and again at launch: a dataset
or secret mount may not be the kit, hold it, or lie inside it.
"""

from __future__ import annotations

from pathlib import PurePath


def kit_bind_problem(source: PurePath, kit: PurePath) -> str | None:
    """What is wrong with lending ``source`` to a job at a site whose kit is ``kit``; None if
    nothing."""
    if source == kit or source in kit.parents:
        return (f"{source} holds the site kit {kit} (its startup/ has the site's private key): "
                "name the data folder itself")
    if kit in source.parents:
        return (f"{source} is inside the site kit {kit} (keys, local/ settings, other jobs' run "
                "folders): keep job data outside the kit")
    return None
