"""The modules a parent needs for its first job, loaded once the parent is up rather than
with that job.

A parent starts small (start -> ready is one of our targets) and used to load the job path's
modules with its first job: the models of meta.json, study_runtime.yaml and privacy.yaml, the
job archive, the site's launcher. That cost a site parent about 0.08 CPU-s between the
server's dispatch and the worker's start, the path from submit to the first task. Once the
site has connected to its server (site/connection.py, beside its verifier's start), a thread
loads them, so that a job finds them loaded. Only imports: no job is read, no launcher is
made (making one may reach its engine; that stays with the first job, which reports it).
"""

from __future__ import annotations

import importlib
import logging
import threading

log = logging.getLogger("atoll.parent.first_job")

# What site/supervisor.py's job path imports (its _run, _fetch, _provenance), and what they do.
SITE_MODULES = (
    "zipfile",
    "atoll.spec.meta",
    "atoll.spec.study_runtime",
    "atoll.spec.privacy",
    "atoll.wire.job_archive",
    "atoll.site.job_acceptance",
    "atoll.site.approvals",
    "atoll.site.provenance",
    "atoll.launchers.request",
)

_started = threading.Event()


def load_soon(modules: tuple[str, ...], launcher: str | None = None) -> None:
    """Import ``modules`` and the module of the launcher named ``launcher`` on a thread of
    their own, once per process; a module that fails to load is left to the job that needs it
    (which reports the error where it belongs)."""
    if _started.is_set():
        return
    _started.set()

    def run() -> None:
        from atoll.launchers.registry import LAUNCHERS

        names = list(modules)
        if launcher in LAUNCHERS:
            names.append(LAUNCHERS[launcher].partition(":")[0])
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - an optional SDK; the job says it better
                log.debug("%s not loaded ahead of the first job: %s", name, exc)

    threading.Thread(target=run, name="first-job-modules", daemon=True).start()
