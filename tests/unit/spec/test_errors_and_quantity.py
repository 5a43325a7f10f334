from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from atoll.spec.errors import Issue, SpecError, issues_from_validation_error, join_path
from atoll.spec.quantity import bytes_to_memory, is_memory, memory_to_bytes, memory_to_mib


def test_issue_and_spec_error_list_every_problem_as_path_colon_message():
    err = SpecError([Issue("a.b", "first"), Issue("c[0]", "second")])
    assert str(err) == "a.b: first\nc[0]: second"
    with_source = SpecError([Issue("x", "bad")], source="local/site.yaml")
    assert str(with_source) == "local/site.yaml: 1 problem\n  x: bad"
    assert str(Issue("", "whole document")) == "whole document"


def test_join_path_renders_list_indices_and_skips_empty_parts():
    assert join_path("deploy_map", "app", 0) == "deploy_map.app[0]"
    assert join_path("", "studies", "", "x") == "studies.x"


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mode: int


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: dict[str, _Inner]


def test_pydantic_errors_become_readable_issues_without_urls():
    with pytest.raises(Exception) as info:
        _Outer.model_validate({"items": {"a": {"mode": "x", "extra": 1}, "b": {}}})
    issues = {i.path: i.message for i in issues_from_validation_error(info.value, _Outer, "top")}
    assert issues == {
        "top.items.a.mode": "must be an integer, not 'x'",
        "top.items.a.extra": "unknown key; allowed keys: mode",
        "top.items.b.mode": "required key is missing; add it",
    }
    assert not any("pydantic" in m for m in issues.values())


def test_mapping_type_errors_never_echo_the_value():
    with pytest.raises(Exception) as info:
        _Outer.model_validate({"items": {"a": "s3cret-value"}})
    (issue,) = issues_from_validation_error(info.value, _Outer)
    assert issue.message == "must be a mapping, not a string"


@pytest.mark.parametrize(
    ("text", "mib"), [("1Mi", 1), ("512Mi", 512), ("64Gi", 65536), ("2Ti", 2 * 1024 * 1024)]
)
def test_memory_sizes(text, mib):
    assert memory_to_mib(text) == mib
    assert memory_to_bytes(text) == mib * 1024 * 1024


def test_seed_memory_in_bytes_and_mib():
    assert memory_to_bytes("64Gi") == 68719476736
    assert memory_to_mib("64Gi") == 65536


@pytest.mark.parametrize(
    "bad",
    [
        "0Gi",
        "064Gi",
        "1.5Gi",
        "64G",
        "64gi",
        "64 Gi",
        "Gi",
        "-1Mi",
        "64Ki",
        "",
        "64GiB",
        64,
        None,
        True,
    ],
)
def test_memory_rejects_anything_but_the_documented_format(bad):
    assert not is_memory(bad)
    if isinstance(bad, str):
        with pytest.raises(ValueError, match="Mi, Gi or Ti"):
            memory_to_bytes(bad)


def test_bytes_to_memory_picks_the_largest_exact_unit():
    assert bytes_to_memory(68719476736) == "64Gi"
    assert bytes_to_memory(3 * 1024 * 1024) == "3Mi"
    assert bytes_to_memory(1) == "1Mi"
    assert bytes_to_memory(1024**4) == "1Ti"
