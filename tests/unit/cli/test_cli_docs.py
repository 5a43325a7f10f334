"""The reference docs cover what the code has: every environment variable the CLI reads, every
role, shell completion that works as documented (issue 25, wrong turn 10)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from atoll.pki.identity import ROLES

ROOT = Path(__file__).resolve().parents[3]


def test_every_environment_variable_the_cli_reads_is_documented():
    read = set()
    for folder in ("cli", "admin"):
        for path in (ROOT / "src" / "atoll" / folder).glob("*.py"):
            read |= set(re.findall(r"environ(?:\.get)?[\[(]\s*\"(ATOLL_[A-Z_]+)\"", path.read_text()))
    assert {"ATOLL_HOME", "ATOLL_KIT", "ATOLL_POC_WORKSPACE"} <= read
    reference = (ROOT / "docs" / "cli.md").read_text()
    section = reference[reference.index("## Environment variables"):]
    assert [name for name in sorted(read) if f"| `{name}` |" not in section] == []


def test_the_roles_table_has_a_column_per_role():
    text = (ROOT / "docs" / "roles.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| what |"))
    assert re.findall(r"`(\w+)`", header) == list(ROLES)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert all(line.count(" | ") == len(ROLES) for line in rows)  # a cell per role in each row


def test_shell_completion_works_as_documented():
    reference = (ROOT / "docs" / "cli.md").read_text()
    assert 'eval "$(_ATOLL_COMPLETE=bash_source atoll)"' in reference
    atoll = Path(sys.executable).parent / "atoll"
    script = subprocess.run([str(atoll)], env={**os.environ, "_ATOLL_COMPLETE": "bash_source"},
                            capture_output=True, text=True, timeout=60)
    assert "complete -o nosort -F _atoll_completion atoll" in script.stdout
    words = subprocess.run([str(atoll)], capture_output=True, text=True, timeout=60, env={
        **os.environ, "_ATOLL_COMPLETE": "bash_complete", "COMP_WORDS": "atoll job s",
        "COMP_CWORD": "2"})
    assert {"plain,status", "plain,submit"} <= set(words.stdout.split())
