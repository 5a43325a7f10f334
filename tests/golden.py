"""Golden files: compare a rendered object with tests/golden/<name>.json.

On a mismatch the test fails with a unified diff and the command that regenerates the file:
``ATOLL_REGEN_GOLDEN=1 .venv/bin/pytest <test>``. Review the diff before committing it. A run that
regenerates never passes (the variable leaking into an environment must not turn the suite
green), and under ``CI=true`` nothing is regenerated at all.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
REGEN_VAR = "ATOLL_REGEN_GOLDEN"


def to_golden_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def _current_test() -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" ", 1)[0] or "tests/"


def assert_golden(name: str, obj: Any) -> None:
    """``obj`` (JSON-serializable) must equal tests/golden/<name>.json exactly."""
    path = GOLDEN_DIR / f"{name}.json"
    actual = to_golden_text(obj)
    regen = f"{REGEN_VAR}=1 .venv/bin/pytest '{_current_test()}'"
    # a golden already equal is left alone, so a test with several reaches the one that changed
    if os.environ.get(REGEN_VAR) == "1" and not (path.exists() and path.read_text() == actual):
        if os.environ.get("CI") == "true":
            pytest.fail(f"golden files cannot be regenerated under CI ({REGEN_VAR}=1 is set)",
                        pytrace=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        pytest.fail(f"regenerated golden/{name}.json: review `git diff {GOLDEN_DIR.name}`, then "
                    f"run the test again without {REGEN_VAR}", pytrace=False)
    if not path.exists():
        pytest.fail(f"golden file {path} does not exist; create it with:\n  {regen}")
    expected = path.read_text()
    if expected != actual:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{name}.json",
                tofile="rendered",
            )
        )
        pytest.fail(
            f"rendered object differs from golden/{name}.json:\n{diff}\n"
            f"If the change is intended, regenerate and review:\n  {regen}",
            pytrace=False,
        )
