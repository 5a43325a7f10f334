"""A provisioned example project (DESIGN.md's), generated once per test session."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from atoll.pki.project import Project, parse_project
from atoll.pki.provision import ProvisionResult, provision

EXAMPLE: dict[str, Any] = {
    "name": "pathology-consortium",
    "server": {"name": "server", "host": "fl.example.org", "port": 8443},
    "sites": [
        {"name": "hospital-a", "org": "hospital-a"},
        {"name": "hospital-b", "org": "hospital-b"},
        {"name": "university", "org": "university"},
    ],
    "users": [
        {"name": "admin@consortium.org", "org": "consortium", "role": "project_admin"},
        {"name": "lead@hospital-a.org", "org": "hospital-a", "role": "lead"},
    ],
    "studies": {
        "pathology": {
            "sites": ["hospital-a", "hospital-b", "university"],
            "admins": ["lead@hospital-a.org"],
        },
        "outcomes": {"sites": ["hospital-a", "hospital-b"], "admins": ["lead@hospital-a.org"]},
    },
}


@pytest.fixture
def example() -> dict[str, Any]:
    """A fresh deep copy of the example document, free to mutate."""
    return copy.deepcopy(EXAMPLE)


@pytest.fixture
def example_project(example: dict[str, Any]) -> Project:
    return parse_project(example)


@pytest.fixture(scope="session")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> ProvisionResult:
    """The example provisioned once; tests must not modify it."""
    out: Path = tmp_path_factory.mktemp("provisioned")
    return provision(parse_project(copy.deepcopy(EXAMPLE)), out)
