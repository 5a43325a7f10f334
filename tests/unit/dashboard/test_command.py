"""`atoll dashboard`'s command line: another address than the loopback needs --listen-public,
said on purpose; and what a log's tail adds, as the job page follows it."""

from __future__ import annotations

from click.testing import CliRunner

from atoll.cli.main import cli
from atoll.dashboard.federation import added_text


def test_another_address_needs_listen_public(tmp_path):
    done = CliRunner().invoke(cli, ["dashboard", "--host", "0.0.0.0", "--kit", str(tmp_path)],
                              env={"ATOLL_HOME": str(tmp_path)})
    assert done.exit_code == 2
    assert "--host 0.0.0.0 lets other machines reach the dashboard: add --listen-public" in (
        done.output)


def test_the_loopback_needs_no_flag_and_a_missing_kit_is_said(tmp_path):
    done = CliRunner().invoke(cli, ["dashboard", "--kit", str(tmp_path / "none")],
                              env={"ATOLL_HOME": str(tmp_path)})
    assert done.exit_code != 0 and "listen-public" not in done.output


def test_what_a_logs_tail_adds():
    assert added_text("", "a\n") == "a\n"
    assert added_text("a\n", "a\nb\n") == "b\n"
    before = "a" * 600 + "b" * 100
    assert added_text(before, "a" * 500 + "b" * 100 + "new\n") == "new\n"  # the tail moved on
    assert added_text("gone\n", "all new\n") == "all new\n"
