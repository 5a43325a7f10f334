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
