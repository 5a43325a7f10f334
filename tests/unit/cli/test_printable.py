"""What other people wrote (job names, reasons, study and user names) prints as text: control
and invisible formatting characters show as their escapes, in every CLI text output."""

from __future__ import annotations

import ast
import io
import sys
from pathlib import Path

import pytest

from atoll.cli import common
from atoll.cli.common import log_text, printable

CLI = Path(common.__file__).parent


@pytest.mark.parametrize(("text", "shown"), [
    ("plain name é 中 😀", "plain name é 中 😀"),
    ("a\x1b[2Jb", "a\\x1b[2Jb"),
    ("row\nforged", "row\\nforged"),
    ("back\rover", "back\\rover"),
    ("tab\tbell\x07", "tab\\tbell\\x07"),
    ("bidi \u202eevil", "bidi \\u202eevil"),
    ("c1 \x9b31m", "c1 \\x9b31m"),
    ("line\u2028sep", "line\\u2028sep"),
    (42, "42"),
])
def test_printable(text, shown):
    assert printable(text) == shown


def test_multi_line_messages_keep_their_lines_and_nothing_else():
    assert printable("a\n\tb\x1b[0m\r", lines=True) == "a\n\tb\\x1b[0m\\r"


def test_logs_are_escaped_on_a_terminal_and_kept_as_they_are_elsewhere(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = "epoch 1\x1b[2K\rok\n"
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert log_text(log) == log
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert log_text(log) == "epoch 1\\x1b[2K\\rok\n"


def test_every_cli_output_of_server_data_goes_through_printable():
    """No command module formats a value from an answer straight into its output: each
    f-string part that subscripts something (job['name'], part['reason']...) is wrapped."""
    raw = []
    for path in sorted(CLI.glob("*.py")):
        if path.name in {"common.py", "provision.py", "site_render.py", "poc.py", "parents.py",
                         "job_init.py", "entry.py", "main.py", "site_policy.py", "__init__.py"}:
            continue  # local files and the operator's own input, not other users' text
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FormattedValue):
                continue
            value = node.value
            while isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice):
                value = value.value  # printable(name)[:22] cuts what was escaped
            if isinstance(value, ast.Subscript):
                raw.append(f"{path.name}:{node.lineno}: {ast.unparse(node.value)}")
    assert raw == []
