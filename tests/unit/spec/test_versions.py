"""The version policy a server enforces on the sites that connect (spec/versions.py)."""

from __future__ import annotations

import pytest

from atoll.spec.versions import parse, version_refusal


@pytest.mark.parametrize(("text", "parsed"), [
    ("0.2.1", (0, 2, 1)), ("1.4", (1, 4, 0)), ("0.3.0rc1", (0, 3, 0)), ("0.3.0.dev2", (0, 3, 0)),
    ("", None), ("v1.2", None), (None, None), (3, None), ("1." * 100, None),
])
def test_parse(text, parsed):
    assert parse(text) == parsed


@pytest.mark.parametrize("site", ["0.4.0", "0.4.9", "0.3.0", "0.3.7rc1"])
def test_the_servers_release_and_the_one_before_are_admitted(site):
    assert version_refusal(site, "0.4.2") is None


@pytest.mark.parametrize(("site", "words"), [
    ("0.5.0", "newer than the server's 0.4.2: upgrade the server first"),
    ("1.0.0", "newer than the server's 0.4.2"),
    ("0.2.9", "too old for the server's 0.4.2, which admits sites of 0.3 to 0.4"),
    (None, "sent no version as its atoll version"),
    ("banana", "sent 'banana' as its atoll version"),
])
def test_a_site_too_new_too_old_or_silent_is_told_both_versions(site, words):
    why = version_refusal(site, "0.4.2")
    assert why is not None and words in why, why
    assert "docs/operations.md" in why


def test_a_new_major_release_admits_no_site_of_the_previous_one():
    assert "too old" in version_refusal("1.9.0", "2.0.0")
    assert version_refusal("2.0.1", "2.0.0") is None


def test_the_cli_is_named_in_its_own_warning():
    why = version_refusal("0.6.0", "0.4.2", who="CLI")
    assert why.startswith("this CLI runs atoll 0.6.0, newer than the server's 0.4.2")
    assert "then the CLIs" in why
