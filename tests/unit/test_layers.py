"""The architecture holds: the layer rules (import-linter's contracts in pyproject.toml) and the
folder list that docs/architecture.md describes one sentence each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "atoll"


def test_the_layer_rules_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "KEPT" in done.stdout and "BROKEN" not in done.stdout


def test_every_folder_has_its_sentence_in_the_architecture_doc():
    doc = (REPO / "docs" / "architecture.md").read_text()
    described = set(re.findall(r"^\| `(\w+)/` \|", doc, flags=re.MULTILINE))
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert described == folders, (f"described only: {sorted(described - folders)}; "
                                  f"undescribed: {sorted(folders - described)}")
    loose = {p.name for p in SRC.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py", "client.py", "workflow.py"}, sorted(loose)


def _contracts() -> list[dict]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _skeleton(root: Path) -> None:
    """An empty copy of the package's layers: the check runs in a second, on imports we choose."""
    (root / "atoll").mkdir()
    (root / "atoll" / "__init__.py").write_text("")
    for sub in SRC.iterdir():
        if sub.is_dir() and (sub / "__init__.py").exists():
            (root / "atoll" / sub.name).mkdir()
            (root / "atoll" / sub.name / "__init__.py").write_text("")
    for loose in ("client.py", "workflow.py"):
        (root / "atoll" / loose).write_text("")


def _violation(contract: dict) -> tuple[str, str]:
    if contract["type"] == "independence":
        return contract["modules"][0], contract["modules"][1]
    assert contract["type"] == "forbidden", contract
    return contract["source_modules"][-1], contract["forbidden_modules"][-1]


def test_every_layer_rule_fails_on_an_import_that_breaks_it(tmp_path):
    """A contract that cannot fail protects nothing: each one, in turn, meets one import it
    forbids (the last source importing the last forbidden module) in a skeleton of the package,
    and lint-imports must name that contract BROKEN; the clean skeleton keeps them all."""
    import json
    import os

    lint = Path(sys.executable).parent / "lint-imports"
    config = tmp_path / "pyproject.toml"
    contracts = _contracts()
    config.write_text("[tool.importlinter]\nroot_package = \"atoll\"\n"
                      "include_external_packages = true\n"
                      + "".join(f"\n[[tool.importlinter.contracts]]\nname = {json.dumps(c['name'])}\n"
                                + "".join(f"{k} = {json.dumps(v)}\n" for k, v in c.items()
                                          if k != "name") for c in contracts))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def check() -> str:
        done = subprocess.run([str(lint), "--no-cache", str(config)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        return done.stdout + done.stderr

    _skeleton(tmp_path)
    clean = check()
    assert f"Contracts: {len(contracts)} kept, 0 broken." in clean, clean[-3000:]
    for contract in contracts:
        source, target = _violation(contract)
        parts = source.split(".")
        folder = tmp_path.joinpath(*parts)
        broken = (folder / "_broken.py") if folder.is_dir() else folder.with_suffix(".py")
        before = broken.read_text() if broken.exists() else None
        broken.write_text(f"import {target}\n")
        try:
            out = check()
        finally:
            if before is None:
                broken.unlink()
            else:
                broken.write_text(before)
        assert f"{contract['name']} BROKEN" in out, (contract["name"], out[-3000:])
