"""One error hierarchy: every exception atoll defines derives from spec/errors.py's AtollError
(keeping the stdlib base its callers catch) and names an exit code of the one table, which the
module docstring and docs/cli.md show."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import atoll
from atoll.spec import errors
from atoll.spec.errors import EXIT_CODES, AtollError, SpecError

REPO = Path(__file__).resolve().parents[3]


def atoll_exceptions() -> dict[str, type[BaseException]]:
    found = {}
    for module in pkgutil.walk_packages(atoll.__path__, "atoll."):
        if module.name.endswith("__main__") or ".templates" in module.name:
            continue
        loaded = importlib.import_module(module.name)
        for name, value in vars(loaded).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == module.name):
                found[f"{module.name}.{name}"] = value
    return found


def test_every_exception_class_has_the_one_root_and_a_code_of_the_table() -> None:
    found = atoll_exceptions()
    assert len(found) > 40, sorted(found)
    codes = {code for code, _, _ in EXIT_CODES}
    for name, cls in found.items():
        assert issubclass(cls, AtollError), f"{name} does not derive from AtollError"
        assert cls.exit_code in codes - {0}, f"{name}.exit_code {cls.exit_code} is not in the table"


def test_one_name_per_class() -> None:
    names = [qualified.rsplit(".", 1)[1] for qualified in atoll_exceptions()]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_the_stdlib_bases_stay_for_callers_that_catch_them() -> None:
    from atoll.launchers.job_files import JobFileError
    from atoll.pki.kit import KitError
    from atoll.wire.messages import DecodeError

    assert issubclass(KitError, ValueError) and issubclass(DecodeError, ValueError)
    assert issubclass(JobFileError, OSError)
    assert SpecError([]).exit_code == 2 and AtollError("x").exit_code == 1


def test_the_docstring_table_is_the_table() -> None:
    doc = errors.__doc__ or ""
    rows = re.findall(r"^    (\d+) +([A-Z_]+) +(.+)$", doc, re.M)
    assert [(int(code), name) for code, name, _ in rows] == [(c, n) for c, n, _ in EXIT_CODES]
    for (_, _, first), (_, _, meaning) in zip(rows, EXIT_CODES, strict=True):
        assert meaning.startswith(first.strip()), (first, meaning)
    for code, name, _ in EXIT_CODES:
        assert getattr(errors, f"EXIT_{name}") == code


def test_docs_cli_lists_the_table() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    section = text.split("## Exit codes\n", 1)[1]
    for code, name, meaning in EXIT_CODES:
        assert f"| {code} | `{name}` | {meaning} |" in section


@pytest.mark.parametrize("module", ["atoll.server.app", "atoll.site.app", "atoll.worker.__main__"])
def test_the_parents_and_the_worker_point_at_the_table(module: str) -> None:
    path = REPO / "src" / Path(*module.split(".")).with_suffix(".py")
    assert "atoll.spec.errors.EXIT_CODES" in path.read_text().split('"""')[1]


def test_pki_imports_no_admin_for_its_errors() -> None:
    code = ("import sys, atoll.pki.revocation, atoll.pki.kit; "
            "print(sorted(m for m in sys.modules if m.startswith('atoll.admin')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_tree_in_the_docstring_is_the_tree_in_the_code() -> None:
    """spec/errors.py draws every class under its exit code once; the drawing and the classes
    agree both ways (a new class must be drawn, a removed one erased)."""
    doc = errors.__doc__.split("\n    AtollError\n", 1)[1].split("\n\n", 1)[0]
    drawn: dict[str, int] = {}
    code = None
    for line in doc.splitlines():
        head = re.match(r"\s+[├└]── (\d+) [A-Z_]+: \S", line)
        if head:
            code = int(head.group(1))
            continue
        for name in re.findall(r"[A-Za-z]+", line):
            drawn[name] = code
    real = {cls.__name__: cls.exit_code for cls in atoll_exceptions().values()
            if cls is not AtollError and issubclass(cls, AtollError)}
    assert drawn == real
