"""The launcher -> worker environment contract is named once (spec/worker_env.py): no other
module of a parent, launcher or worker spells an ATOLL_* variable of it as a literal, and the
module itself imports nothing (the worker reads it before anything heavy is loaded)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import atoll
from atoll.spec import worker_env

SRC = Path(atoll.__file__).parent
CONTRACT = SRC / "spec" / "worker_env.py"


def test_the_contract_imports_nothing():
    tree = ast.parse(CONTRACT.read_text())
    assert [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)] == []


def _named() -> set[str]:
    return {v for k, v in vars(worker_env).items()
            if k.isupper() and isinstance(v, str) and v.startswith("ATOLL_")
            and k != "RESERVED_ENV_PREFIX"}


def test_no_module_spells_a_contract_variable_itself():
    """Count: literals of the contract's variables outside spec/worker_env.py (before: 57 in
    16 modules; the CLI's own ATOLL_HOME / ATOLL_KIT are not the worker's)."""
    named = _named()
    found = []
    for path in SRC.rglob("*.py"):
        if path == CONTRACT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in named:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value}")
    assert found == []


def test_every_variable_the_contract_names_is_one_of_atolls():
    assert all(re.fullmatch(r"ATOLL_[A-Z0-9_]+", v) for v in _named())
    assert len(_named()) == len(set(_named())) >= 18
