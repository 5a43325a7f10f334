"""A job's ``meta.json``: where its apps run and what they ask for (NVIDIA FLARE 2.9 keys).

``study`` and ``submitter`` are set by the server: a value in the user's file is ignored
(dropped by ``load_meta``) and the server writes its own with ``with_server_fields``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from atoll.spec.errors import Issue, IssuesError, SpecError, describe, join_path
from atoll.spec.launcher_spec import launcher_spec_issues, validate_launcher_spec
from atoll.spec.model import SpecModel, validate_into
from atoll.spec.names import ALL_SITES, SERVER, is_site_name
from atoll.spec.resources import validate_resource_spec

META_FILE = "meta.json"
SERVER_SET_FIELDS = ("study", "submitter")
MAX_CLIENTS = 1_000_000


class JobMeta(SpecModel):
    """The validated ``meta.json`` of a job."""

    name: str = Field(min_length=1, max_length=256, description="The job's name, free text")
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
        issues = []
        named = self.sites()
        for i, site in enumerate(self.mandatory_clients):
            if site == SERVER or (ALL_SITES not in self.targets() and site not in named):
                issues.append(
                    Issue(
                        join_path("mandatory_clients", i),
                        (
                            f"{site!r} is not a site of deploy_map; add it to an app's targets "
                            "or remove it here"
                        ),
                    )
                )
        if self.min_clients is not None and ALL_SITES not in self.targets():
            if self.min_clients > len(named):
                issues.append(
                    Issue(
                        "min_clients",
                        (
                            f"{self.min_clients} is more than the {len(named)} site(s) in deploy_map; "
                            f"write at most {len(named)}"
                        ),
                    )
                )
        issues += launcher_spec_issues(self.launcher_spec, self.resource_spec, self.targets())
        if issues:
            raise IssuesError(issues)
        return self

    def targets(self) -> list[str]:
        """Every name written in deploy_map, in order (``@ALL`` included as written)."""
        return list(dict.fromkeys(t for targets in self.deploy_map.values() for t in targets))

    def sites(self) -> list[str]:
        """The explicitly named sites (neither ``server`` nor ``@ALL``)."""
        return [t for t in self.targets() if t not in (SERVER, ALL_SITES)]

    def expand_targets(self, all_sites: list[str]) -> list[str]:
        """Concrete targets: ``@ALL`` means the server plus ``all_sites`` (the study's sites)."""
        out: list[str] = []
        for target in self.targets():
            out += [SERVER, *all_sites] if target == ALL_SITES else [target]
        return list(dict.fromkeys(out))

    def app_for(self, target: str) -> str | None:
        """The app deployed to ``target`` (an explicit entry wins over ``@ALL``), or None."""
        for app, targets in self.deploy_map.items():
            if target in targets:
                return app
        for app, targets in self.deploy_map.items():
            if ALL_SITES in targets:
                return app
        return None

    def with_server_fields(self, study: str, submitter: str) -> JobMeta:
        """A copy carrying the server's own ``study`` and ``submitter``."""
        return self.model_copy(update={"study": study, "submitter": submitter})


_BAD_APP = "app name must be a folder name in the job: no '/', '\\', '..' or absolute path"
_BAD_TARGET = (
    "is not a target; use 'server', '@ALL' or a site name "
    "(letters, digits, '.', '_', '-'; at most 63 characters)"
)
_NO_SERVER = "no app runs on the server; add 'server' to an app's targets or use [\"@ALL\"]"


def deploy_map_issues(deploy_map: dict[str, list[str]]) -> list[Issue]:
    """The deploy_map rules; paths are relative to ``deploy_map``."""
    if not deploy_map:
        return [Issue("", 'is empty; map at least one app to targets, e.g. {"app": ["@ALL"]}')]
    issues: list[Issue] = []
    seen: dict[str, str] = {}
    for app, targets in deploy_map.items():
        key = app or '""'
        if not _is_safe_app_name(app):
            issues.append(Issue(key, _BAD_APP))
        if not targets:
            issues.append(Issue(key, "has no targets; list 'server', site names, or '@ALL'"))
        if ALL_SITES in targets and len(targets) > 1:
            issues.append(
                Issue(key, '@ALL already means the server and every site; write it alone: ["@ALL"]')
            )
        for i, target in enumerate(targets):
            at = join_path(key, i)
            if target not in (ALL_SITES, SERVER) and not is_site_name(target):
                issues.append(Issue(at, f"{describe(target)} {_BAD_TARGET}"))
            elif target in seen:
                other = seen[target]
                where = "twice in this app" if other == app else f"in apps {other!r} and {app!r}"
                issues.append(Issue(at, f"{target!r} appears {where}; a target runs one app"))
            else:
                seen[target] = app
    if not issues and SERVER not in seen and ALL_SITES not in seen:
        issues.append(Issue("", _NO_SERVER))
    all_app = next((a for a, t in deploy_map.items() if ALL_SITES in t), None)
    if not issues and all_app is not None and len(deploy_map) > 1:
        other = next(a for a in deploy_map if a != all_app)
        issues.append(
            Issue(
                other or '""',
                (
                    f"app {all_app!r} already runs on every target (@ALL); a target runs one app: "
                    "list the targets of each app instead"
                ),
            )
        )
    return issues


def _is_safe_app_name(app: str) -> bool:
    return (
        bool(app)
        and "/" not in app
        and "\\" not in app
        and ".." not in app
        and "\0" not in app
        and app != "."
        and not app.startswith("~")
        and ":" not in app[:2]
    )


def load_meta(source: str | Path | Any) -> JobMeta:
    """Validate a job's meta: a job folder, a ``meta.json`` path, or the parsed document.

    Raises SpecError with every problem. The user's ``study``/``submitter`` are dropped.
    """
    label = META_FILE
    if not isinstance(source, str | Path):
        data: Any = source
    else:
        path = Path(source)
        path = path / META_FILE if path.is_dir() else path
        label = str(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SpecError(
                [Issue("", f"{path} not found; a job folder needs a meta.json")]
            ) from None
        except (OSError, UnicodeDecodeError) as err:
            raise SpecError([Issue("", f"cannot read {path}: {err}")]) from None
        except json.JSONDecodeError as err:
            raise SpecError([Issue("", f"not valid JSON: {err}")], source=label) from None
    if not isinstance(data, dict):
        raise SpecError([Issue("", f"must be a JSON object, not {describe(data)}")], source=label)
    data = {k: v for k, v in data.items() if k not in SERVER_SET_FIELDS}
    meta, issues = validate_into(JobMeta, data)
    if meta is None:
        raise SpecError(issues, source=label)
    return meta
