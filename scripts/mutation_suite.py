#!/usr/bin/env python3
"""The defences' mutation suite: each mutation removes or weakens one defence, and some test must
then fail (docs/testing.md, "Mutation suite").

For each mutation of ``tests/mutation/defences.py`` the file is backed up, rewritten in place
(the tree is the editable install, so the parents and workers a test starts see it too), the
mutation's tests run, and the file is restored, also on Ctrl-C. A mutation no test catches
survives: the run fails naming it. The report (defence, file, caught by) is printed and written
to ``build/mutation-report.md``.

    .venv/bin/python scripts/mutation_suite.py            # every mutation
    .venv/bin/python scripts/mutation_suite.py --list     # what would run
    .venv/bin/python scripts/mutation_suite.py --only secagg
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKUP_SUFFIX = ".mutation-backup"
DEFAULT_TIMEOUT = 180  # seconds per mutation: its tests are chosen fast


@dataclass
class Outcome:
    defence: str
    path: str
    caught: bool
    caught_by: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""


class StaleList(Exception):
    """A mutation does not apply to the tree any more: the list must be brought up to date."""


def load_mutations(defences_file: Path):
    spec = importlib.util.spec_from_file_location("mutation_defences", defences_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module while the file runs
    spec.loader.exec_module(module)
    return module.MUTATIONS


def check_applies(root: Path, mutation) -> str:
    """The mutated text of the mutation's file; StaleList when its snippet is not there once."""
    path = root / mutation.path
    if not path.is_file():
        raise StaleList(f"{mutation.defence}: {mutation.path} does not exist")
    text = path.read_text()
    count = text.count(mutation.find)
    if count != 1:
        raise StaleList(f"{mutation.defence}: its snippet occurs {count} times in {mutation.path} "
                        f"(it must occur exactly once):\n    {mutation.find!r}")
    if mutation.find == mutation.replace:
        raise StaleList(f"{mutation.defence}: its replacement changes nothing")
    for test in mutation.tests:
        if not (root / test.split("::", 1)[0]).exists():
            raise StaleList(f"{mutation.defence}: test {test} does not exist")
    mutated = text.replace(mutation.find, mutation.replace)
    if path.suffix == ".py":  # a mutant that does not even compile proves nothing
        try:
            compile(mutated, str(path), "exec")
        except SyntaxError as exc:
            raise StaleList(f"{mutation.defence}: the mutated {mutation.path} does not compile "
                            f"(line {exc.lineno}: {exc.msg})") from None
    return mutated


def _backup(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def leftover_backups(root: Path, mutations) -> list[Path]:
    return sorted({_backup(root / m.path) for m in mutations if _backup(root / m.path).exists()})


def _failed_tests(junit: Path, root: Path | None = None) -> list[str]:
    try:
        tree = ET.parse(junit)
    except (OSError, ET.ParseError):
        return []
    failed = []
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(_node_id(case.get("classname", ""), case.get("name", ""), root))
    return failed


def _node_id(classname: str, name: str, root: Path | None) -> str:
    """pytest's node id of a junit test case: its file, then its class (if any) and name."""
    parts = [p for p in classname.split(".") if p]
    for end in range(len(parts), 0, -1):  # the longest prefix that is a test file
        if root is not None and (root / ("/".join(parts[:end]) + ".py")).is_file():
            return "::".join(["/".join(parts[:end]) + ".py", *parts[end:], name])
    return f"{'/'.join(parts)}.py::{name}" if parts else name


def run_mutation(root: Path, mutation, python: str | None, timeout: float) -> Outcome:
    """Apply one mutation, run its tests, restore the file; whatever happens, restore it.
    ``python`` None: in a child forked from this process (see ``_preload``)."""
    mutated = check_applies(root, mutation)
    path = root / mutation.path
    backup = _backup(path)
    original = path.read_bytes()
    backup.write_bytes(original)
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATOLL_REGEN_GOLDEN", "PYTEST_ADDOPTS", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc of the mutant outlives it
    with tempfile.TemporaryDirectory(prefix="atoll-mutation-") as tmp:
        junit, log = Path(tmp) / "junit.xml", Path(tmp) / "pytest.log"
        args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                f"--junitxml={junit}", f"--timeout={mutation.timeout}", *mutation.tests]
        try:
            path.write_text(mutated)
            if python is None:
                rc = _run_forked(args, root, env, log, timeout, path)
            else:
                rc = _run_subprocess([python, "-m", "pytest", *args], root, env, log, timeout)
        finally:
            path.write_bytes(original)
            backup.unlink()
        failed = _failed_tests(junit, root)
        text = log.read_text(errors="replace") if log.exists() else ""
    seconds = time.monotonic() - start
    if rc is None:
        return Outcome(mutation.defence, mutation.path, False, seconds=seconds,
                       note=f"its tests ran past {timeout:.0f} s (not counted as caught)")
    if rc == 0:
        return Outcome(mutation.defence, mutation.path, False, seconds=seconds)
    if rc == 1 and failed:
        return Outcome(mutation.defence, mutation.path, True, failed, seconds)
    # 2-5: interrupted, internal error, usage error, nothing collected: not a catch.
    tail = text.strip().splitlines()[-3:]
    return Outcome(mutation.defence, mutation.path, False, seconds=seconds,
                   note=f"pytest exited {rc} without a failing test: {' | '.join(tail)}")


def confirm_catches(root: Path, outcomes: list[Outcome], python: str | None,
                    timeout: float) -> None:
    """A catch counts only when its test passes on the tree as it is: a test that fails anyway
    (broken by another change) "catches" every mutant. Each catching test runs once more,
    unmutated, all in one run; a catch whose tests all fail there too is no catch."""
    ids = sorted({t for o in outcomes if o.caught for t in o.caught_by})
    if not ids:
        return
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATOLL_REGEN_GOLDEN", "PYTEST_ADDOPTS", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    with tempfile.TemporaryDirectory(prefix="atoll-mutation-") as tmp:
        junit, log = Path(tmp) / "junit.xml", Path(tmp) / "pytest.log"
        args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--junitxml={junit}",
                f"--timeout={int(timeout)}", *ids]
        if python is None:
            rc = _run_forked(args, root, env, log, timeout * 4, None)
        else:
            rc = _run_subprocess([python, "-m", "pytest", *args], root, env, log, timeout * 4)
        broken = set(_failed_tests(junit, root))
        ran = _ran_tests(junit, root)
    for o in outcomes:
        if not o.caught:
            continue
        unconfirmed = [t for t in o.caught_by if t in broken or t not in ran]
        if len(unconfirmed) == len(o.caught_by):
            why = ("its catching test fails on the unmutated tree too" if rc is not None
                   else "the unmutated re-run of its catching tests ran past its limit")
            o.caught, o.note = False, f"{why}: {', '.join(unconfirmed)}"
            o.caught_by = []


def _ran_tests(junit: Path, root: Path) -> set[str]:
    try:
        tree = ET.parse(junit)
    except (OSError, ET.ParseError):
        return set()
    return {_node_id(c.get("classname", ""), c.get("name", ""), root) for c in tree.iter("testcase")}


def _run_subprocess(argv: list[str], root: Path, env: dict[str, str], log: Path,
                    timeout: float) -> int | None:
    """pytest's exit code, or None past ``timeout`` (its process group is killed)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:
                _killpg(proc.pid)
                proc.wait()


# Imported once by the runner, before any child is forked: what every test process loads and
# atoll is not. Nothing of atoll may be imported here, or a child would run the original code.
PRELOAD = ("pytest", "_pytest.junitxml", "pytest_timeout", "numpy", "pydantic", "yaml",
           "cryptography.x509", "cryptography.hazmat.primitives.asymmetric.ec", "hypothesis",
           "opacus.accountants")  # the privacy tests' accountant: seconds a mutation otherwise


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _run_forked(args: list[str], root: Path, env: dict[str, str], log: Path, timeout: float,
                mutated: Path | None) -> int | None:
    """pytest.main in a child forked from this process: its imports are already made (about a
    second a mutation on a quiet machine). The mutated module must not be loaded here."""
    target = os.path.realpath(mutated) if mutated is not None else None
    for module in list(sys.modules.values()):
        if target and os.path.realpath(getattr(module, "__file__", None) or "/") == target:
            raise RuntimeError(f"{mutated} is imported by the runner: a forked child would run "
                               "the original; run with --no-fork")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setsid()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.chdir(root)
            os.environ.clear()
            os.environ.update(env)
            sys.dont_write_bytecode = True
            sys.path[0] = str(root)  # as `python -m pytest` run from the root
            import pytest

            code = int(pytest.main(args))
        except BaseException:  # noqa: BLE001 - whatever happens, the child ends here
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline, done = time.monotonic() + timeout, 0
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
    finally:
        if not done:
            _killpg(pid)
            os.waitpid(pid, 0)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # not its own group yet: the child alone
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def report_table(outcomes: list[Outcome]) -> str:
    lines = ["| defence | file | caught by | s |", "| --- | --- | --- | --- |"]
    for o in outcomes:
        by = ", ".join(f"`{t}`" for t in o.caught_by) if o.caught else f"**SURVIVED** {o.note}"
        defence = o.defence.replace("|", "\\|")  # a table cell: O_NOFOLLOW|O_EXCL
        lines.append(f"| {defence} | `{o.path}` | {by} | {o.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="only the mutations whose "
                        "defence or file contains this text (case-insensitive; repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--defences", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, default=None,
                        help="where to write the report (default build/mutation-report.md)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds per mutation (default {DEFAULT_TIMEOUT})")
    parser.add_argument("--python", default=None, help="run each mutation's tests with this "
                        "interpreter in a new process (implies --no-fork)")
    parser.add_argument("--no-fork", action="store_true", help="start a new Python for each "
                        "mutation instead of forking this one with pytest already imported")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    mutations = load_mutations(args.defences or root / "tests/mutation/defences.py")
    only = [text.lower() for text in args.only]
    chosen = [m for m in mutations if not only or any(
        text in m.defence.lower() or text in m.path.lower() for text in only)]
    if not chosen:
        print(f"error: no mutation matches {args.only!r}", file=sys.stderr)
        return 2
    stale = []
    for m in chosen:
        try:
            check_applies(root, m)
        except StaleList as exc:
            stale.append(str(exc))
    if stale:
        print("error: the mutation list is stale:\n  " + "\n  ".join(stale) + "\nUpdate "
              "tests/mutation/defences.py to the code as it is now (never drop a defence).",
              file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.defence}\n    {m.path}\n    tests: {' '.join(m.tests)}")
        return 0
    left = leftover_backups(root, chosen)
    if left:
        names = "\n".join(f"    mv {p} {str(p)[: -len(BACKUP_SUFFIX)]}" for p in left)
        print("error: a mutation backup from an interrupted run is still there; the file next "
              f"to it may be mutated. Restore it first:\n{names}", file=sys.stderr)
        return 2
    python = None
    if args.no_fork or args.python or not hasattr(os, "fork"):
        python = args.python or str(root / ".venv/bin/python")
    else:
        try:
            import pytest  # noqa: F401 - the forked children run it
        except ImportError:
            print("error: pytest is not importable here; run this script with the project's "
                  f"{root / '.venv/bin/python'}, or pass --python", file=sys.stderr)
            return 2
        _preload()
    # A plain `kill` restores the file as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        for i, m in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {m.defence} ({m.path}) ...", end=" ", flush=True)
            outcome = run_mutation(root, m, python, args.timeout)
            outcomes.append(outcome)
            print(f"{'caught' if outcome.caught else 'SURVIVED'} ({outcome.seconds:.0f} s)",
                  flush=True)
        print("confirming that each catching test passes on the unmutated tree ...", flush=True)
        confirm_catches(root, outcomes, python, args.timeout)
    except KeyboardInterrupt:
        print("\ninterrupted: the mutated file was restored", file=sys.stderr)
        return 130
    total = time.monotonic() - started
    survived = [o for o in outcomes if not o.caught]
    table = report_table(outcomes)
    summary = (f"{len(outcomes) - len(survived)} of {len(outcomes)} mutations caught in "
               f"{total:.0f} s\n")
    report = args.report or root / "build/mutation-report.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(f"# Mutation suite\n\n{summary}\n{table}")
    print(f"\n{table}\n{summary}report: {report}")
    if survived:
        print("error: these defences can be removed with every test still green; add a test "
              "that fails without them:", file=sys.stderr)
        for o in survived:
            print(f"    {o.defence} ({o.path}) {o.note}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
