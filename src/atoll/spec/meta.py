"""A job's ``meta.json``: where its apps run and what they ask for (NVIDIA FLARE 2.9 keys).

``study`` and ``submitter`` are set by the server: a value in the user's file is ignored
(dropped by ``load_meta``) and the server writes its own with ``with_server_fields``.

The document is bounded (MAX_META_BYTES, MAX_META_DEPTH, MAX_LIST, MAX_APPS): the server sends
it to every site inside one control message, so a job's meta must never grow without limit.
The limits are listed with the errors users see in docs/federation.md ("Limits").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from atoll.spec.errors import Issue, IssuesError, SpecError, describe
from atoll.spec.flare_meta import normalize_flare_meta, point_back
from atoll.spec.launcher_spec import launcher_spec_issues, validate_launcher_spec

# the rules and limits without a model, shared with the plain check (spec/meta_plain.py)
from atoll.spec.meta_plain import (  # noqa: F401 - MAX_* and META_FILE are this module's too
    MAX_APPS,
    MAX_CLIENTS,
    MAX_LIST,
    MAX_META_BYTES,
    MAX_META_DEPTH,
    MAX_NAME,
    META_FILE,
    SERVER_SET_FIELDS,
    Targets,
    decode_meta,
    deploy_map_issues,
    mandatory_issues,
    min_clients_issues,
    read_meta_bytes,
    shape_issue,
    site_list_issues,
)
from atoll.spec.model import SpecModel, validate_into
from atoll.spec.names import ALL_SITES
from atoll.spec.resources import validate_resource_spec


class JobMeta(SpecModel, Targets):
    """The validated ``meta.json`` of a job."""

    name: str = Field(min_length=1, max_length=MAX_NAME, description="The job's name, free text")
    deploy_map: dict[str, list[str]] = Field(
        description='App folder -> targets: "server", site names, or ["@ALL"] (server + sites)'
    )
    min_clients: int | None = Field(
        None, ge=1, le=MAX_CLIENTS, description="Sites that must be online to start the job"
    )
    mandatory_clients: list[str] = Field(
        default_factory=list, description="Sites without which the job does not start"
    )
    resource_spec: dict[str, Any] = Field(
        default_factory=dict, description="Portable resources: @default and per-target blocks"
    )
    launcher_spec: dict[str, Any] = Field(
        default_factory=dict, description="Job-settable backend topology: default and per-site"
    )
    study: str | None = Field(None, description="Set by the server; a user's value is ignored")
    submitter: str | None = Field(None, description="Set by the server; a user's value is ignored")

    @field_validator("deploy_map")
    @classmethod
    def _deploy_map(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        issues = deploy_map_issues(value)
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("mandatory_clients")
    @classmethod
    def _mandatory_clients(cls, value: list[str]) -> list[str]:
        issues = site_list_issues(value)
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("resource_spec")
    @classmethod
    def _resource_spec(cls, value: dict[str, Any]) -> dict[str, Any]:
        issues = validate_resource_spec(value, path="")
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("launcher_spec")
    @classmethod
    def _launcher_spec(cls, value: dict[str, Any]) -> dict[str, Any]:
        issues = validate_launcher_spec(value, path="")
        if issues:
            raise IssuesError(issues)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> JobMeta:
        named, every = self.sites(), ALL_SITES in self.targets()
        issues = mandatory_issues(self.mandatory_clients, named, every)
        issues += min_clients_issues(self.min_clients, named, every)
        issues += launcher_spec_issues(self.launcher_spec, self.resource_spec, self.targets())
        if issues:
            raise IssuesError(issues)
        return self

    def with_server_fields(self, study: str, submitter: str) -> JobMeta:
        """A copy carrying the server's own ``study`` and ``submitter``."""
        return self.model_copy(update={"study": study, "submitter": submitter})


def load_meta(source: str | Path | Any) -> JobMeta:
    """Validate a job's meta: a job folder, a ``meta.json`` path, or the parsed document.

    Raises SpecError with every problem. The user's ``study``/``submitter`` are dropped.
    """
    if isinstance(source, str | Path):
        path = Path(source)
        path = path / META_FILE if path.is_dir() else path
        return parse_meta(read_meta_bytes(path, str(path)), str(path))
    return _validate(source, META_FILE)


def parse_meta(raw: bytes, label: str = META_FILE) -> JobMeta:
    """Validate the bytes of a meta.json (UTF-8 JSON within the limits)."""
    return _validate(decode_meta(raw, label), label)


def validate_meta(data: Any, label: str = META_FILE) -> JobMeta:
    """A decoded meta.json through the models: the JobMeta, or SpecError naming every problem."""
    return _validate(data, label)


def _validate(data: Any, label: str) -> JobMeta:  # every validation of a meta comes here
    if not isinstance(data, dict):
        raise SpecError([Issue("", f"must be a JSON object, not {describe(data)}")], source=label)
    shape = shape_issue(data)
    if shape is not None:
        raise SpecError([shape], source=label)
    data = {k: v for k, v in data.items() if k not in SERVER_SET_FIELDS}
    data, issues, moved = normalize_flare_meta(data)  # NVIDIA FLARE's spellings -> atoll's
    meta, found = validate_into(JobMeta, data)
    issues += [point_back(issue, moved) for issue in found]
    if meta is None or issues:
        raise SpecError(issues, source=label)
    return meta
