"""The defences' mutation suite (scripts/mutation_suite.py, tests/mutation/defences.py): its list
applies to the tree as it is (each snippet exactly once, each mutant compiles, each test exists),
and the runner, on a small project of its own, tells a caught mutation from a survivor and
always puts the file back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_runner():
    spec = importlib.util.spec_from_file_location("mutation_suite", ROOT / "scripts/mutation_suite.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runner = _load_runner()
MUTATIONS = runner.load_mutations(ROOT / "tests/mutation/defences.py")


def test_the_list_names_each_defence_once_with_tests():
    names = [m.defence for m in MUTATIONS]
    assert len(names) == len(set(names)), "two mutations share a defence's name"
    assert all(m.tests for m in MUTATIONS)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.defence for m in MUTATIONS])
def test_each_mutation_applies_to_the_tree_as_it_is(mutation):
    runner.check_applies(ROOT, mutation)  # StaleList says what moved


def test_no_mutation_backup_is_left_in_the_tree():
    assert runner.leftover_backups(ROOT, MUTATIONS) == []


TOY_MODULE = '''\
def check(name):
    if ".." in name:
        raise ValueError("refused")
    return name


def shout(text):
    return text.upper()
'''
TOY_TEST = '''\
import pytest

from toy import check


def test_dot_dot_is_refused():
    with pytest.raises(ValueError):
        check("../x")


def test_a_plain_name_passes():
    assert check("x") == "x"
'''
TOY_DEFENCES = '''\
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutation:
    defence: str
    path: str
    find: str
    replace: str
    tests: list = field(default_factory=list)
    timeout: int = 60


MUTATIONS = [
    Mutation("no dot-dot", "toy.py", 'if ".." in name:', "if False:", ["test_toy.py"]),
    Mutation("loud", "toy.py", "return text.upper()", "return text", ["test_toy.py"]),
]
'''


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    (tmp_path / "toy.py").write_text(TOY_MODULE)
    (tmp_path / "test_toy.py").write_text(TOY_TEST)
    (tmp_path / "defences.py").write_text(TOY_DEFENCES)
    (tmp_path / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    return tmp_path


def _main(toy: Path, *extra: str, fork: bool = False) -> int:
    how = [] if fork else ["--python", sys.executable]
    return runner.main(["--root", str(toy), "--defences", str(toy / "defences.py"),
                        "--report", str(toy / "report.md"), *how, *extra])


@pytest.mark.parametrize("fork", [False, True], ids=["new-python", "forked"])
def test_a_caught_and_a_surviving_mutation_are_told_apart_and_the_file_restored(toy, capsys,
                                                                                fork):
    assert _main(toy, fork=fork) == 1  # "loud" has no test: it survives
    out, err = capsys.readouterr()
    report = (toy / "report.md").read_text()
    assert "| no dot-dot | `toy.py` | `test_toy.py::test_dot_dot_is_refused` |" in report
    assert "| loud | `toy.py` | **SURVIVED**" in report
    assert "1 of 2 mutations caught" in report
    assert "loud (toy.py)" in err and "no dot-dot (toy.py)" not in err
    assert (toy / "toy.py").read_text() == TOY_MODULE
    assert not (toy / "toy.py.mutation-backup").exists()


def test_only_runs_the_chosen_mutations(toy):
    assert _main(toy, "--only", "dot-dot") == 0
    assert "1 of 1 mutations caught" in (toy / "report.md").read_text()
    assert (toy / "toy.py").read_text() == TOY_MODULE


def test_a_stale_snippet_is_refused_before_anything_is_mutated(toy, capsys):
    (toy / "toy.py").write_text(TOY_MODULE.replace('if ".." in name:', 'if "/.." in name:'))
    assert _main(toy) == 2
    assert "no dot-dot: its snippet occurs 0 times in toy.py" in capsys.readouterr().err
    assert not (toy / "report.md").exists()


def test_a_mutant_that_does_not_compile_is_refused(toy, capsys):
    (toy / "defences.py").write_text(TOY_DEFENCES.replace('"return text"', '"return text)"'))
    assert _main(toy) == 2
    assert "the mutated toy.py does not compile" in capsys.readouterr().err


def test_a_backup_left_by_a_crashed_run_stops_the_run(toy, capsys):
    (toy / "toy.py.mutation-backup").write_text(TOY_MODULE)
    assert _main(toy) == 2
    assert "Restore it first" in capsys.readouterr().err
    assert (toy / "toy.py.mutation-backup").exists()


def test_the_file_is_restored_when_the_run_is_interrupted(toy, monkeypatch):
    def interrupted(*args, **kwargs):
        assert "if False:" in (toy / "toy.py").read_text()  # the mutant is in place
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.subprocess, "Popen", interrupted)
    assert _main(toy, "--only", "dot-dot") == 130
    assert (toy / "toy.py").read_text() == TOY_MODULE
    assert not (toy / "toy.py.mutation-backup").exists()


def test_a_hanging_test_is_not_counted_as_a_catch(toy):
    (toy / "test_toy.py").write_text(TOY_TEST + '''

def test_slow():
    import time
    time.sleep(60)
''')
    assert _main(toy, "--only", "loud", "--timeout", "3") == 1
    assert "ran past 3 s" in (toy / "report.md").read_text()
    assert (toy / "toy.py").read_text() == TOY_MODULE


@pytest.mark.parametrize("fork", [False, True], ids=["new-python", "forked"])
def test_a_test_that_fails_unmutated_too_is_no_catch(toy, capsys, fork):
    """A broken test "catches" every mutant: each catch is confirmed on the unmutated tree."""
    (toy / "test_toy.py").write_text(TOY_TEST + '''

def test_broken_anyway():
    assert False
''')
    assert _main(toy, "--only", "loud", fork=fork) == 1
    report = (toy / "report.md").read_text()
    assert ("| loud | `toy.py` | **SURVIVED** its catching test fails on the unmutated tree "
            "too: test_toy.py::test_broken_anyway |") in report, report
    assert "0 of 1 mutations caught" in report
    assert (toy / "toy.py").read_text() == TOY_MODULE


def test_a_class_test_is_named_by_its_file_and_class(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    assert runner._node_id("tests.test_x.TestA", "test_b[1]", tmp_path) == \
        "tests/test_x.py::TestA::test_b[1]"
    assert runner._node_id("tests.test_x", "test_c", tmp_path) == "tests/test_x.py::test_c"
