"""Which `atoll` command lines go straight to a parent's own entry, skipping the CLI."""

from __future__ import annotations

import pytest

from atoll.cli.entry import parent_argv


@pytest.mark.parametrize(("argv", "expected"), [
    (["server", "start", "{kit}"], ["server", "{kit}"]),
    (["site", "start", "-v", "{kit}"], ["site", "{kit}", "--verbose"]),
    (["site", "start", "{kit}", "--ready-file", "r.json", "--verbose"],
     ["site", "{kit}", "--ready-file", "r.json", "--verbose"]),
])
def test_a_plain_foreground_start_goes_straight_to_the_parent(tmp_path, argv, expected):
    fill = [a.format(kit=tmp_path) for a in argv]
    assert parent_argv(fill) == [a.format(kit=tmp_path) for a in expected]


@pytest.mark.parametrize("argv", [
    ["server", "start", "{kit}", "--detach"],  # the CLI waits until it is ready
    ["server", "start", "--help"],
    ["server", "start", "{kit}", "{kit}"],  # two kits: the CLI explains
    ["server", "start", "{kit}/missing"],  # the CLI names what is wrong
    ["server", "start", "{kit}", "--ready-file"],
    ["server", "stop", "{kit}"],
    ["job", "list"],
    ["server"],
])
def test_everything_else_goes_to_the_cli(tmp_path, argv):
    assert parent_argv([a.format(kit=tmp_path) for a in argv]) is None
