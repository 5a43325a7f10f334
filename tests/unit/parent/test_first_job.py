"""The job path's modules, loaded by a parent once it is up (parent/first_job.py): in a fresh
interpreter, as a site parent has them before any job, and what fails to load is left to the
job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from atoll.parent import first_job
from atoll.site import supervisor


def _loaded_after(modules: tuple[str, ...], launcher: str | None) -> dict[str, bool]:
    code = textwrap.dedent(f"""
        import json, sys, threading
        from atoll.parent import first_job
        before = set(sys.modules)
        first_job.load_soon({modules!r}, {launcher!r})
        [t.join() for t in threading.enumerate() if t.name == "first-job-modules"]
        print(json.dumps({{m: m in sys.modules and m not in before
                           for m in [*{modules!r}, "atoll.launchers.process",
                                     "atoll.launchers.docker"]}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def test_a_site_parents_job_path_is_loaded_with_its_launcher():
    loaded = _loaded_after(first_job.SITE_MODULES, "process")
    assert all(loaded[m] for m in first_job.SITE_MODULES), loaded
    assert loaded["atoll.launchers.process"] and not loaded["atoll.launchers.docker"]


def test_a_module_that_does_not_load_is_skipped_and_the_rest_load():
    loaded = _loaded_after(("atoll.no_such_module", "atoll.spec.privacy"), "no-such-launcher")
    assert loaded == {"atoll.no_such_module": False, "atoll.spec.privacy": True,
                      "atoll.launchers.process": False, "atoll.launchers.docker": False}


def test_the_list_names_what_the_site_job_path_imports():
    """A module the supervisor's job path imports and the list forgets is loaded with the
    first job again: the list is checked against the supervisor's own imports."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(supervisor))
    lazy = {node.module for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
            and fn.name in ("_run", "_fetch", "_provenance")
            for node in ast.walk(fn) if isinstance(node, ast.ImportFrom)}
    lazy |= {alias.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
             and fn.name in ("_run", "_fetch")
             for node in ast.walk(fn) if isinstance(node, ast.Import) for alias in node.names}
    lazy -= {"shutil", "tempfile", "atoll", "atoll.pki.provenance"}  # loaded at rest / by others
    assert lazy <= set(first_job.SITE_MODULES), lazy - set(first_job.SITE_MODULES)
