"""NVIDIA FLARE 2.9 spellings of a ``meta.json``, rewritten into atoll's before validation.

FLARE's job-meta validator accepts more shapes than atoll's canonical form; each hop (the CLI,
the server, the site) parses a meta through ``spec.meta``, which calls ``normalize_flare_meta``
first, so every hop sees the same canonical document:

- ``deploy_map`` targets as ``{"targets": [...]}`` or ``{"sites": [...]}``, a list mixing such
  entries with names, or a single name; ``@all`` in any case is ``@ALL``;
- an app with no targets next to apps that have some (FLARE calls it idle): dropped;
- ``min_clients`` written as a string of digits (FLARE converts it with ``int()``);
- the legacy nested ``resource_spec``: ``{"<site>": {"process": {...}, "docker": {...}}}``. The
  ``process`` block holds the site's resources; each backend block is the site's
  ``launcher_spec`` block for that backend unless ``launcher_spec`` has one (``default`` or the
  site's); a backend ``num_of_gpus`` equal to the ``process`` one is the same request.

Problems found here are Issues with the path the user wrote; ``moved_blocks`` names the nested
blocks that now live in ``launcher_spec``, so that errors found there point back at them.
"""

from __future__ import annotations

import re
from typing import Any

from atoll.spec.errors import Issue, describe, join_path

ALL_SITES = "@ALL"
BACKEND_KEYS = ("process", "docker", "k8s", "slurm")
_TARGET_KEYS = ("targets", "sites")
_DIGITS = re.compile(r"[0-9]{1,9}")  # what FLARE's int() takes, bounded


def normalize_flare_meta(data: dict[str, Any]) -> tuple[dict[str, Any], list[Issue], dict]:
    """``(canonical document, issues, moved_blocks)``; the input is not changed."""
    data = dict(data)
    issues: list[Issue] = []
    if isinstance(data.get("deploy_map"), dict):
        data["deploy_map"], found = _deploy_map(data["deploy_map"])
        issues += found
    clients = data.get("min_clients")
    if isinstance(clients, str) and _DIGITS.fullmatch(clients.strip()):
        data["min_clients"] = int(clients.strip())
    moved: dict[str, str] = {}
    if isinstance(data.get("resource_spec"), dict):
        spec = data.get("launcher_spec")
        launcher = dict(spec) if isinstance(spec, dict) else {}
        data["resource_spec"], moved, found = _nested_resource_spec(data["resource_spec"], launcher)
        issues += found
        if moved:
            data["launcher_spec"] = launcher
    return data, issues, moved


def _deploy_map(deploy_map: dict[str, Any]) -> tuple[dict[str, Any], list[Issue]]:
    out: dict[str, Any] = {}
    issues: list[Issue] = []
    for app, entry in deploy_map.items():
        targets, problem = _targets(entry)
        if problem:
            issues.append(Issue(join_path("deploy_map", str(app)), problem))
            continue
        out[app] = targets
    if any(out.values()):  # idle apps next to deployed ones: FLARE deploys them nowhere
        out = {app: targets for app, targets in out.items() if not isinstance(targets, list)
               or targets}
    return out, issues


def _targets(entry: Any) -> tuple[Any, str | None]:
    """FLARE's target forms as one list of names; anything else is left for the model."""
    if isinstance(entry, str):
        entry = [entry]
    elif isinstance(entry, dict):
        unknown = sorted(str(k) for k in entry if k not in _TARGET_KEYS)
        if unknown or len(entry) != 1:
            return entry, (f"a mapping of targets takes one key, targets or sites (FLARE's "
                           f"forms), not {', '.join(unknown) or ', '.join(map(str, entry))}")
        entry = next(iter(entry.values()))
    if not isinstance(entry, list):
        return entry, None  # the model reports the type
    names: list[Any] = []
    for item in entry:
        if isinstance(item, dict):
            inner = item.get("sites", item.get("targets"))
            extra = sorted(str(k) for k in item if k not in _TARGET_KEYS)
            if extra or not isinstance(inner, list):
                return entry, ("an entry of the list may be a name or {targets: [...]} / "
                               f"{{sites: [...]}}, not {describe(item)}")
            names += inner
        else:
            names.append(item)
    return [ALL_SITES if isinstance(n, str) and n.casefold() == "@all" else n
            for n in names], None


def _nested_resource_spec(
    spec: dict[str, Any], launcher: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str], list[Issue]]:
    out: dict[str, Any] = {}
    issues: list[Issue] = []
    moved: dict[str, str] = {}  # "launcher_spec.<site>.<backend>" -> "resource_spec.<site>..."
    default_blocks = launcher.get("default") if isinstance(launcher.get("default"), dict) else {}
    for target, block in spec.items():
        nested = isinstance(block, dict) and any(k in block for k in BACKEND_KEYS)
        if target == "@default" or not nested:
            out[target] = block
            continue
        process = block.get("process", {})
        if not isinstance(process, dict):
            issues.append(Issue(join_path("resource_spec", str(target), "process"),
                                f"must be a mapping of resources, not {describe(process)}"))
        resources = dict(process) if isinstance(process, dict) else {}
        out[target] = {**{k: v for k, v in block.items() if k not in BACKEND_KEYS}, **resources}
        own = launcher.get(target, {})
        if not isinstance(own, dict):
            continue  # launcher_spec's own error is reported; nothing is moved over it
        own = dict(own)
        for backend in BACKEND_KEYS[1:]:
            if backend not in block or backend in own or backend in (default_blocks or {}):
                continue  # launcher_spec wins, as in FLARE
            native = block[backend]
            if isinstance(native, dict) and native.get("num_of_gpus") == resources.get(
                "num_of_gpus", object()
            ):
                native = {k: v for k, v in native.items() if k != "num_of_gpus"}
            own[backend] = native
            moved[join_path("launcher_spec", str(target), backend)] = join_path(
                "resource_spec", str(target), backend
            )
        if own:
            launcher[target] = own
    return out, moved, issues


def point_back(issue: Issue, moved: dict[str, str]) -> Issue:
    """An Issue found in a block moved out of the nested resource_spec, at the path written."""
    for now, written in moved.items():
        if issue.path == now or issue.path.startswith(now + "."):
            return Issue(written + issue.path[len(now):], issue.message)
    return issue
