"""The one grammar of each identifier that crosses a trust boundary (spec/names.py)."""

from __future__ import annotations

import pytest

from atoll.spec import names
from atoll.spec.names import IdentifierError

HOSTILE = ["", ".", "..", "../x", "x/..", "a/b", "/abs", "a\\b", "x\n", "\nx", "a\0b", "a b",
           "$(id)", "`id`", "a;b", "a|b", "a&b", "a>b", "'a'", '"a"', "~x", "x\t", "\x7f",
           "é", None, 1, True, ["x"], {"x": 1}, b"abc"]


@pytest.mark.parametrize(("check", "good"), [
    (names.check_job_id, ["0123456789abcdef0123456789abcdef", "j1", "a_b-c", "A" * 64]),
    (names.check_task_id, ["t1", "t123456"]),
    (names.check_site_name, ["site-1", "Hospital_A.east", "server", "s" * 63]),
    (names.check_study_name, ["default", "pathology", "a_b-1"]),
    (names.check_user_name, ["admin@consortium.org", "a.b+c@x-y.example"]),
    (names.check_task_name, ["train", "validate", "statistics_spread", "__end__", "a.b"]),
    (names.check_dataset_name, ["records", "a-1"]),
    (names.check_app_name, ["app", "app-server", "App 1", "ünï"]),
])
def test_each_grammar_takes_its_ids_and_refuses_paths_and_shell_text(check, good):
    for value in good:
        assert check(value) == value
    for value in HOSTILE:
        if check is names.check_app_name and value in ("a b", "é", "'a'", '"a"', "a;b", "a|b",
                                                       "a&b", "a>b", "$(id)", "`id`"):
            continue  # an app name is a folder of the signed job, never a shell word
        with pytest.raises(IdentifierError):
            check(value)


def test_lengths_are_bounded():
    with pytest.raises(IdentifierError):
        names.check_job_id("a" * 65)
    with pytest.raises(IdentifierError):
        names.check_site_name("s" * 64)
    with pytest.raises(IdentifierError):
        names.check_user_name("a" * 250 + "@x.org")
    with pytest.raises(IdentifierError):  # the pattern alone takes a domain of any length
        names.check_user_name("a@" + "b" * 250 + ".org")
    assert names.check_user_name("a@" + "b" * 240 + ".org")
    with pytest.raises(IdentifierError):
        names.check_app_name("a" * 256)


@pytest.mark.parametrize("value", [0, 1, 10**9])
def test_rounds_are_bounded_whole_numbers(value):
    assert names.check_round(value) == value


@pytest.mark.parametrize("value", [-1, 10**9 + 1, True, 1.0, "1", None, [1]])
def test_other_rounds_are_refused(value):
    with pytest.raises(IdentifierError, match="round"):
        names.check_round(value)


def test_an_optional_round_may_be_none():
    assert names.check_round(None, optional=True) is None


def test_the_error_names_the_field_and_a_truncated_value():
    with pytest.raises(IdentifierError) as caught:
        names.check_job_id("../" * 10_000, "dispatch job_id")
    message = str(caught.value)
    assert message.startswith("dispatch job_id '../../")
    assert "30,002 characters" in message and len(message) < 300
