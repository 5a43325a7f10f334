"""The CLI's one error renderer (cli/common.py render_error): every command's errors, one shape,
the exit code of the error (atoll.spec.errors.EXIT_CODES)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from atoll.admin.errors import ConnectionFailed, NotFound
from atoll.cli.common import fail, format_option, handle_errors, render_error
from atoll.pki.kit import KitError
from atoll.spec.errors import Issue, SpecError

SPEC = SpecError([Issue("name", "'Demo' is not a valid name"), Issue("port", "must be at least 1")],
                 source="project.yaml")
PROBLEMS = [{"file": "local/site.yaml", "path": "process", "message": "not for docker"},
            {"file": "meta.json", "path": "", "message": "no app"}]


def run(error: object, *args: str):
    """A command with --format that ends on ``error``: raised (an exception, which
    handle_errors renders) or rendered by the command itself (a list of problems)."""

    @click.command()
    @format_option
    @handle_errors
    def command(fmt: str) -> None:
        if isinstance(error, BaseException):
            raise error
        render_error(error)  # type: ignore[arg-type]

    return CliRunner().invoke(command, list(args))


@pytest.mark.parametrize(("error", "code", "text"), [
    (NotFound("no such job"), 5, "error: no such job\n"),
    (ConnectionFailed("cannot reach the server"), 3, "error: cannot reach the server\n"),
    (KitError("kit.yaml is missing"), 2, "error: kit.yaml is missing\n"),
    (KeyboardInterrupt(), 130, "error: interrupted\n"),
    (SPEC, 2, "error: project.yaml: 2 problems\n  - name: 'Demo' is not a valid name\n"
              "  - port: must be at least 1\n"),
])
def test_an_error_is_one_sentence_or_a_list_and_its_code(error, code, text) -> None:
    result = run(error)
    assert (result.exit_code, result.stderr, result.stdout) == (code, text, "")


def test_problems_of_several_files_name_their_file() -> None:
    result = run(PROBLEMS)
    assert result.exit_code == 2
    assert result.stderr == ("error: 2 problems\n  - local/site.yaml: process: not for docker\n"
                             "  - meta.json: no app\n")


@pytest.mark.parametrize(("error", "code", "body"), [
    (NotFound("no such job"), 5,
     {"code": "NOT_FOUND", "exit_code": 5, "message": "no such job"}),
    (SPEC, 2, {"code": "INVALID", "exit_code": 2,
               "message": "project.yaml: 2 problems\n  - name: 'Demo' is not a valid name\n"
                          "  - port: must be at least 1",
               "problems": [{"file": "project.yaml", "path": "name",
                             "message": "'Demo' is not a valid name"},
                            {"file": "project.yaml", "path": "port",
                             "message": "must be at least 1"}]}),
    (PROBLEMS, 2, {"code": "INVALID", "exit_code": 2,
                   "message": "2 problems\n  - local/site.yaml: process: not for docker\n"
                              "  - meta.json: no app",
                   "problems": PROBLEMS}),
    (KeyboardInterrupt(), 130, {"code": "INTERRUPTED", "exit_code": 130,
                                "message": "interrupted"}),
])
def test_with_format_json_stdout_gets_the_error(error, code, body) -> None:
    result = run(error, "--format", "json")
    assert result.exit_code == code and result.stderr == ""
    assert json.loads(result.stdout) == {"error": body}


def test_control_characters_of_a_message_are_shown_escaped() -> None:
    @click.command()
    def command() -> None:
        fail("job \x1b[2Jname\u202e", 3)

    result = CliRunner().invoke(command)
    assert result.exit_code == 3 and result.stderr == "error: job \\x1b[2Jname\\u202e\n"
