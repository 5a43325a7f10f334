"""A job's ``meta.json``: where its apps run and what they ask for (NVIDIA FLARE 2.9 keys).

``study`` and ``submitter`` are set by the server: a value in the user's file is ignored
(dropped by ``load_meta``) and the server writes its own with ``with_server_fields``.

The document is bounded (MAX_META_BYTES, MAX_META_DEPTH, MAX_LIST, MAX_APPS): the server sends
it to every site inside one control message, so a job's meta must never grow without limit.
The limits are listed with the errors users see in docs/federation.md ("Limits").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from atoll.spec.errors import Issue, IssuesError, SpecError, describe, join_path
from atoll.spec.flare_meta import normalize_flare_meta, point_back
from atoll.spec.launcher_spec import launcher_spec_issues, validate_launcher_spec
from atoll.spec.model import SpecModel, validate_into
from atoll.spec.names import ALL_SITES, SERVER, is_app_name, is_site_name
from atoll.spec.resources import validate_resource_spec

META_FILE = "meta.json"
SERVER_SET_FIELDS = ("study", "submitter")
MAX_CLIENTS = 1_000_000
# A dispatch carries the meta re-encoded as ASCII JSON: at most 3x these bytes (a 2-byte
# character becomes \uXXXX), well inside wire/frames.py's MAX_CONTROL.
MAX_META_BYTES = 1024 * 1024
MAX_META_DEPTH = 32  # objects and lists inside each other; a real meta nests 4 deep
MAX_LIST = 10_000  # sites in mandatory_clients, or targets of one app
MAX_APPS = 1_000  # apps in deploy_map
_SURROGATE = re.compile("[\ud800-\udfff]")


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
        issues = []
        named = self.sites()
        known, every = set(named), ALL_SITES in self.targets()  # once: lists run to MAX_LIST
        for i, site in enumerate(self.mandatory_clients):
            if site == SERVER or (not every and site not in known):
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


_BAD_APP = ("app name must be a folder name in the job: no '/', '\\', '..', absolute path, "
            "control character or leading '~' or '-'; at most 255 bytes")
_BAD_TARGET = (
    "is not a target; use 'server', '@ALL' or a site name "
    "(letters, digits, '.', '_', '-'; at most 63 characters)"
)
_NO_SERVER = "no app runs on the server; add 'server' to an app's targets or use [\"@ALL\"]"


def site_list_issues(sites: list[str]) -> list[Issue]:
    """A list of sites (``mandatory_clients``): at most MAX_LIST, each once; paths are relative
    to the list. Only the first few repeats are named: the message stays short."""
    if len(sites) > MAX_LIST:
        return [Issue("", f"lists {len(sites):,} sites; at most {MAX_LIST:,} are allowed (list "
                          "each site once)")]
    first: dict[str, int] = {}
    issues: list[Issue] = []
    repeats = 0
    for i, site in enumerate(sites):
        if site not in first:
            first[site] = i
            continue
        repeats += 1
        if len(issues) < 3:
            issues.append(Issue(join_path("", i), f"{describe(site)} is already listed at "
                                                  f"[{first[site]}]; list each site once"))
    if repeats > len(issues):
        more = repeats - len(issues)
        issues.append(Issue("", f"and {more:,} more repeated site{'s' if more > 1 else ''}"))
    return issues


def deploy_map_issues(deploy_map: dict[str, list[str]]) -> list[Issue]:
    """The deploy_map rules; paths are relative to ``deploy_map``."""
    if not deploy_map:
        return [Issue("", 'is empty; map at least one app to targets, e.g. {"app": ["@ALL"]}')]
    if len(deploy_map) > MAX_APPS:
        return [Issue("", f"has {len(deploy_map):,} apps; at most {MAX_APPS:,} are allowed")]
    too_long = [Issue(app or '""', f"lists {len(t):,} targets; at most {MAX_LIST:,} are allowed "
                                   '(use ["@ALL"] for every site of the study)')
                for app, t in deploy_map.items() if len(t) > MAX_LIST]
    if too_long:
        return too_long
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
    return is_app_name(app)  # the one grammar of app names (spec/names.py)


def load_meta(source: str | Path | Any) -> JobMeta:
    """Validate a job's meta: a job folder, a ``meta.json`` path, or the parsed document.

    Raises SpecError with every problem. The user's ``study``/``submitter`` are dropped.
    """
    if isinstance(source, str | Path):
        path = Path(source)
        path = path / META_FILE if path.is_dir() else path
        return parse_meta(read_meta_bytes(path, str(path)), str(path))
    return _validate(source, META_FILE)


def read_meta_bytes(path: Path, label: str = META_FILE) -> bytes:
    """The bytes of a meta.json, refused before reading when over MAX_META_BYTES."""
    try:
        if path.is_dir():
            raise SpecError([Issue("", f"{label} is a folder; it must be a file")])
        size = path.stat().st_size
        if size > MAX_META_BYTES:
            raise SpecError([Issue("", f"{label} is {size:,} bytes; the limit is "
                                       f"{MAX_META_BYTES:,} (1 MiB): a meta names apps, sites "
                                       "and resources, and lists each site once")])
        with open(path, "rb") as fh:
            return fh.read(MAX_META_BYTES + 1)
    except FileNotFoundError:
        raise SpecError([Issue("", f"{label} not found; a job folder needs a meta.json")]) from None
    except OSError as err:
        raise SpecError([Issue("", f"cannot read {label}: {err.strerror or err}")]) from None


def parse_meta(raw: bytes, label: str = META_FILE) -> JobMeta:
    """Validate the bytes of a meta.json (UTF-8 JSON within the limits)."""
    if len(raw) > MAX_META_BYTES:
        raise SpecError([Issue("", f"is {len(raw):,} bytes; the limit is {MAX_META_BYTES:,}")],
                        source=label)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SpecError([Issue("", f"is not UTF-8 text (byte {err.start}); save it as UTF-8")],
                        source=label) from None
    except RecursionError:
        raise SpecError([Issue("", f"nests deeper than {MAX_META_DEPTH} levels")],
                        source=label) from None
    except ValueError as err:
        raise SpecError([Issue("", f"not valid JSON: {err}")], source=label) from None
    return _validate(data, label)


def _validate(data: Any, label: str) -> JobMeta:
    if not isinstance(data, dict):
        raise SpecError([Issue("", f"must be a JSON object, not {describe(data)}")], source=label)
    shape = _shape_issue(data)
    if shape is not None:
        raise SpecError([shape], source=label)
    data = {k: v for k, v in data.items() if k not in SERVER_SET_FIELDS}
    data, issues, moved = normalize_flare_meta(data)  # NVIDIA FLARE's spellings -> atoll's
    meta, found = validate_into(JobMeta, data)
    issues += [point_back(issue, moved) for issue in found]
    if meta is None or issues:
        raise SpecError(issues, source=label)
    return meta


def _shape_issue(data: dict[str, Any]) -> Issue | None:
    """Nesting deeper than MAX_META_DEPTH, or text no store can hold (a lone surrogate, which
    JSON's \\ud800 escapes can make), named by its top-level key. Iterative: a deep document
    must not exhaust the stack of the process that checks it."""
    for key, value in data.items():
        where = str(key)[:60] if not _SURROGATE.search(str(key)) else ""
        stack = [(key, 2), (value, 2)]  # the document itself is level 1
        while stack:
            item, depth = stack.pop()
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    return Issue(where, "holds a lone surrogate (an escape such as \\ud800 "
                                        "that is not a character); write real characters")
            elif isinstance(item, dict | list):
                if depth > MAX_META_DEPTH:
                    return Issue(where, f"nests deeper than {MAX_META_DEPTH} levels")
                if isinstance(item, dict):
                    stack.extend((k, depth + 1) for k in item)
                    stack.extend((v, depth + 1) for v in item.values())
                else:
                    stack.extend((v, depth + 1) for v in item)
    return None
