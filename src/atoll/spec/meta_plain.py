"""``meta.json`` without pydantic: its bytes, its plain rules, and a check of the common shape.

The models of spec/meta.py (pydantic, with the resource and launcher specs) cost a fresh process
about 0.15 CPU-s to import, and three hops on the path from ``atoll job submit`` to the first
round read a meta before anything else needs them: the CLI's check before it sends the job, the
server parent's intake and scheduler (whose dispatch to the sites would otherwise wait for the
import, about 0.1 s), and the server worker, which reads the signed meta for the app it runs. So
the common shape is checked here in plain Python first:

- ``vouch_meta(data)`` returns a ``PlainMeta`` when every rule of the models holds for the whole
  document (name, deploy_map, min_clients, mandatory_clients; no resource_spec or launcher_spec
  beyond ``{}``; no NVIDIA FLARE spelling to rewrite), and ``None`` as soon as anything is
  outside that. ``None`` is never a verdict: ``read_meta`` then runs the models, which accept
  or name each problem. So this module only ever accepts what the models accept, with the
  same values, and it never words an error of the document itself.
- tests/unit/spec/test_meta_plain.py holds it to that, document by mutated document.

The rules that need no model (the bytes' limits, the deploy_map and site-list rules, nesting
and lone surrogates) live here, and spec/meta.py's models call them: one copy of each.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from atoll.spec.errors import EXIT_INVALID, AtollError, Issue, SpecError, describe, join_path
from atoll.spec.names import ALL_SITES, SERVER, is_app_name, is_site_name

if TYPE_CHECKING:
    from atoll.spec.meta import JobMeta

META_FILE = "meta.json"
SERVER_SET_FIELDS = ("study", "submitter")
MAX_CLIENTS = 1_000_000
# A dispatch carries the meta re-encoded as ASCII JSON: at most 3x these bytes (a 2-byte
# character becomes \uXXXX), well inside wire/frames.py's MAX_CONTROL.
MAX_META_BYTES = 1024 * 1024
MAX_META_DEPTH = 32  # objects and lists inside each other; a real meta nests 4 deep
MAX_LIST = 10_000  # sites in mandatory_clients, or targets of one app
MAX_APPS = 1_000  # apps in deploy_map
MAX_NAME = 256  # characters of the job's name
_SURROGATE = re.compile("[\ud800-\udfff]")


class Targets:
    """What a meta's deploy_map says, for the models (JobMeta) and the plain check alike: each
    defines ``deploy_map`` itself (a field of either)."""

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


@dataclass(frozen=True)
class PlainMeta(Targets):
    """A meta.json this module vouched for, as the models would give it."""

    name: str
    deploy_map: dict[str, list[str]]
    min_clients: int | None = None
    mandatory_clients: list[str] = field(default_factory=list)
    resource_spec: dict[str, Any] = field(default_factory=dict)
    launcher_spec: dict[str, Any] = field(default_factory=dict)
    study: str | None = None  # the server's own, never the user's (as in the models)
    submitter: str | None = None

    def with_server_fields(self, study: str, submitter: str) -> PlainMeta:
        """A copy carrying the server's own ``study`` and ``submitter``."""
        return replace(self, study=study, submitter=submitter)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        """The document JobMeta's ``model_dump(mode="json")`` gives for the same meta: the
        job's record at the server, and what its sites are sent."""
        return {"name": self.name,
                "deploy_map": {app: list(targets) for app, targets in self.deploy_map.items()},
                "min_clients": self.min_clients,
                "mandatory_clients": list(self.mandatory_clients),
                "resource_spec": dict(self.resource_spec),
                "launcher_spec": dict(self.launcher_spec),
                "study": self.study, "submitter": self.submitter}


# A meta as a hop holds it: vouched for here, or validated by the models (either reads alike).
Meta: TypeAlias = "PlainMeta | JobMeta"


# --- the rules without a model ------------------------------------------------------------------

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
        if not is_app_name(app):  # the one grammar of app names (spec/names.py)
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


def mandatory_issues(mandatory: list[str], named: list[str], every: bool) -> list[Issue]:
    """``mandatory_clients`` that deploy_map never runs (``every``: it has ``@ALL``)."""
    known = set(named)  # once: lists run to MAX_LIST
    return [Issue(join_path("mandatory_clients", i),
                  f"{site!r} is not a site of deploy_map; add it to an app's targets or remove "
                  "it here")
            for i, site in enumerate(mandatory)
            if site == SERVER or (not every and site not in known)]


def min_clients_issues(min_clients: int | None, named: list[str], every: bool) -> list[Issue]:
    """``min_clients`` more than the sites deploy_map names (none with ``@ALL``)."""
    if min_clients is None or every or min_clients <= len(named):
        return []
    return [Issue("min_clients", f"{min_clients} is more than the {len(named)} site(s) in "
                                 f"deploy_map; write at most {len(named)}")]


def shape_issue(data: dict[str, Any]) -> Issue | None:
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


# --- the bytes ----------------------------------------------------------------------------------


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


def decode_meta(raw: bytes, label: str = META_FILE) -> Any:
    """The JSON document of a meta.json's bytes (UTF-8, within the limits); not yet checked."""
    if len(raw) > MAX_META_BYTES:
        raise SpecError([Issue("", f"is {len(raw):,} bytes; the limit is {MAX_META_BYTES:,}")],
                        source=label)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SpecError([Issue("", f"is not UTF-8 text (byte {err.start}); save it as UTF-8")],
                        source=label) from None
    except RecursionError:
        raise SpecError([Issue("", f"nests deeper than {MAX_META_DEPTH} levels")],
                        source=label) from None
    except ValueError as err:
        raise SpecError([Issue("", f"not valid JSON: {err}")], source=label) from None


def read_meta(raw: bytes, label: str = META_FILE) -> PlainMeta | JobMeta:
    """A meta.json's bytes checked whole: in plain Python when ``vouch_meta`` vouches for it,
    else by the models, which accept it or raise SpecError naming every problem."""
    return check_meta(decode_meta(raw, label), label)


def check_meta(data: Any, label: str = META_FILE) -> PlainMeta | JobMeta:
    """A decoded meta document (a server's dispatch carries one) checked as ``read_meta``
    checks the bytes of one."""
    plain = vouch_meta(data)
    if plain is not None:
        return plain
    from atoll.spec.meta import validate_meta  # pydantic: only for the shapes left to it

    return validate_meta(data, label)


# --- the check of the common shape --------------------------------------------------------------

_FIELDS = {"name", "deploy_map", "min_clients", "mandatory_clients", "resource_spec",
           "launcher_spec", *SERVER_SET_FIELDS}


class UnvouchedMeta(AtollError):
    """Outside what this module checks: the models decide (never leaves vouch_meta())."""

    exit_code = EXIT_INVALID


def _require(ok: bool) -> None:
    if not ok:
        raise UnvouchedMeta


def _strings(value: Any) -> list[str]:
    _require(type(value) is list and all(type(v) is str for v in value))
    return list(value)


def vouch_meta(data: Any) -> PlainMeta | None:
    """The meta when it passes every rule of the models in its common shape, else None (the
    models decide: they accept it or name each problem)."""
    try:
        _require(type(data) is dict and set(data) <= _FIELDS and shape_issue(data) is None)
        name = data.get("name")
        _require(type(name) is str and 1 <= len(name) <= MAX_NAME)
        raw_map = data.get("deploy_map")
        _require(type(raw_map) is dict and all(type(app) is str for app in raw_map))
        deploy_map = {app: _strings(targets) for app, targets in raw_map.items()}
        # also unvouched: FLARE's spellings the models rewrite first (@all in another case, an
        # idle app), which these rules refuse as written
        _require(not deploy_map_issues(deploy_map))
        min_clients = data.get("min_clients")
        _require(min_clients is None
                 or (type(min_clients) is int and 1 <= min_clients <= MAX_CLIENTS))
        mandatory = _strings(data.get("mandatory_clients", []))
        _require(not site_list_issues(mandatory))
        for spec in ("resource_spec", "launcher_spec"):  # any content: the models' own checks
            _require(data.get(spec, {}) == {} and type(data.get(spec, {})) is dict)
        meta = PlainMeta(name, deploy_map, min_clients, mandatory)
        named, every = meta.sites(), ALL_SITES in meta.targets()
        _require(not mandatory_issues(mandatory, named, every)
                 and not min_clients_issues(min_clients, named, every))
        return meta
    except UnvouchedMeta:
        return None
    except Exception:  # noqa: BLE001 - an odd value (an unhashable key...): the models decide
        return None
