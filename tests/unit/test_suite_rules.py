"""The suite's own rules (tests/conftest.py, tests/golden.py) hold: under CI=true a skip fails
unless a reviewed platform reason explains it, and golden files cannot be rewritten by a test
run that then passes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

SKIPPING = """
import pytest

def test_missing_dependency():
    pytest.importorskip("no_such_module_atoll_test")

def test_platform_case():
    pytest.skip("Linux only: a platform the project does not run on")
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_skips=SKIPPING)
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_under_ci_a_skip_for_a_missing_dependency_fails_and_names_it(pytester, monkeypatch):
    result = _run(pytester, monkeypatch, ci=True)
    result.assert_outcomes(failed=1, skipped=1)
    out = result.stdout.str()
    assert "skipped under CI=true, where a skip is a failure" in out
    assert "no_such_module_atoll_test" in out
    # the allowed one is printed at the end, so a reviewer sees every skip CI took
    assert "skips allowed under CI=true" in out
    assert "test_skips.py::test_platform_case: Linux only" in out


def test_outside_ci_skips_stay_skips(pytester, monkeypatch):
    _run(pytester, monkeypatch, ci=False).assert_outcomes(skipped=2)


def test_a_module_level_skip_fails_under_ci(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_module_skip='import pytest\n'
                        'pytest.importorskip("no_such_module_atoll_test")\n'
                        'def test_never_runs():\n    pass\n')
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    assert "no_such_module_atoll_test" in result.stdout.str()


GOLDEN_TEST = """
from tests.golden import assert_golden

def test_render():
    assert_golden("sample", {"a": 1})
"""


def _golden_run(pytester, monkeypatch, **env):
    repo = Path(__file__).resolve().parents[2]
    pytester.makepyfile(test_golden=GOLDEN_TEST)
    monkeypatch.setenv("PYTHONPATH", str(repo))  # the subprocess imports tests.golden
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    golden = repo / "tests" / "golden" / "sample.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    written = golden.exists()
    golden.unlink(missing_ok=True)
    return result, written


def test_regenerating_golden_files_never_passes(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    result, written = _golden_run(pytester, monkeypatch, ATOLL_REGEN_GOLDEN="1")
    result.assert_outcomes(failed=1)
    assert written
    assert "regenerated golden/sample.json" in result.stdout.str()


def test_golden_files_cannot_be_regenerated_under_ci(pytester, monkeypatch):
    result, written = _golden_run(pytester, monkeypatch, ATOLL_REGEN_GOLDEN="1", CI="true")
    result.assert_outcomes(failed=1)
    assert not written
    assert "cannot be regenerated under CI" in result.stdout.str()
