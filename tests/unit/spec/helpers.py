"""Small helpers for asserting on SpecError issues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from atoll.spec.errors import Issue, SpecError


def issues_of(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Issue]:
    with pytest.raises(SpecError) as info:
        fn(*args, **kwargs)
    assert info.value.issues, "a SpecError must carry at least one issue"
    return info.value.issues


def by_path(issues: list[Issue]) -> dict[str, str]:
    out: dict[str, str] = {}
    for issue in issues:
        out[issue.path] = (
            f"{out[issue.path]} | {issue.message}" if issue.path in out else issue.message
        )
    return out
