"""A parent's job path loaded ahead: shortly after the parent starts, not with its first job.

A parent checks ``local/`` in a forked child and starts without pydantic (local_config.py), and
loaded the rest with its first job: pydantic and the spec models, PyYAML, the launcher and its
settings. That cost every parent 0.15-0.25 CPU-s on the path from `atoll job submit` to the
first round: the server built its launcher between a job's intake and its dispatch, each site
parsed the dispatched meta and study_runtime.yaml with the models before fetching the job, and
on a small host the three paid it at once. The tiny job (bench/compare (a)) took 0.25 s longer.

So each parent loads them on a thread of its own ``WARM_AFTER_S`` after it started, once its
start (the check of ``local/``, listening or dialling the server, the sandbox's probe) is done
with the CPU, and a job that comes sooner loads what it needs itself, as before. The price is
memory: about 14 MiB more in a parent that has not run a job yet; every parent holds it after
its first job. A launcher other than the process launcher, and what only some jobs need, still
come with the job that needs them.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atoll.parent.local_config import LocalConfig

log = logging.getLogger("atoll.parent")

WARM_AFTER_S = 1.0

# What each parent's first job imports, costliest first (pydantic comes with the first).
MODULES = {
    "server": ("atoll.spec.meta", "atoll.launchers.request"),
    "site": ("atoll.spec.meta", "atoll.launchers.request", "atoll.site.job_acceptance",
             "atoll.spec.privacy"),
}


def warm(role: str, local: LocalConfig) -> None:
    """Import ``role``'s job path and make its launcher. Never raises: whatever fails here
    fails again, and is reported, with the job that needs it."""
    try:
        for name in MODULES[role]:
            importlib.import_module(name)
        # The process launcher is made now too (site.yaml's model, its settings). The others
        # load their client (docker, kubernetes) and may dial their engine: with a job, whose
        # container, pod or batch job takes seconds to start anyway.
        if local.launcher_name == "process":
            local.launcher  # noqa: B018
    except Exception as exc:  # noqa: BLE001 - the first job meets it and says so
        log.debug("the job path was not loaded ahead: %s", exc)


def warm_later(role: str, local: LocalConfig, delay: float = WARM_AFTER_S) -> threading.Timer:
    """``warm`` on a timer thread ``delay`` seconds from now."""
    timer = threading.Timer(delay, warm, args=(role, local))
    timer.name, timer.daemon = "job-path", True
    timer.start()
    return timer
