"""``app.yaml`` checked without pydantic when the file is of a common shape.

The site worker checks its app's app.yaml before the job's script runs (fl/runner.py), and the
CLI checks every app of a job folder before it sends the job (fl/job_folder_check.py): the
same strict check as everywhere (fl/app_config.py's models, all of the file, the server's
section and its workflow's arguments included). Importing those models is most of a site
worker's own CPU (pydantic and the privacy models: 130 ms of a ~300 ms worker on a quiet
machine), so the common shapes are checked here in plain Python first:

- ``vouch(data)`` returns the site's and the server's sections when every rule of the models
  holds for the whole document, and ``None`` as soon as anything is outside what it knows (a
  privacy or MLflow section, a custom key, a value of an unexpected type, a non-finite number,
  any error). ``None`` is never a verdict: the caller then runs the models, which accept or raise
  the error naming each field. So this module only ever accepts what the models accept, with
  the same values, and it never words an error itself.
- tests/unit/fl/test_app_config_plain.py holds it to that: its tables match the models'
  fields, types, defaults and bounds, and documents mutated field by field are accepted here
  only where the models accept them.

The file's helpers that both need (its name, the path rule, ``FILE.py:NAME``) live here, so
that fl/app_config.py and this check share one copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError

APP_FILE = "app.yaml"


class AppConfigError(AtollError, ValueError):
    """Every problem of one app.yaml, each naming its field."""

    exit_code = EXIT_INVALID

    def __init__(self, source: str, errors: list[str]):
        self.source = source
        self.errors = errors
        super().__init__(
            f"{source}: " + ("\n  ".join([""] + errors) if len(errors) > 1 else errors[0])
        )


def relative_file(value: str, suffixes: tuple[str, ...]) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or "\\" in value:
        raise ValueError(f"must be a relative path inside the app folder, got {value!r}")
    if path.suffix not in suffixes:
        raise ValueError(f"must end with {' or '.join(suffixes)}, got {value!r}")
    return value


def custom_workflow(value: str) -> tuple[str, str] | None:
    """``(file, class)`` of a job's own workflow (``FILE.py:CLASS``); None for a built-in name."""
    file, colon, name = value.partition(":")
    return (file, name) if colon else None


@dataclass(frozen=True)
class PlainSite:
    """app.yaml's ``site:`` as the models would give it (fl/app_config.py SiteSection)."""

    script: str
    args: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


class PlainArgs:
    """A built-in workflow's arguments as its model (fl/app_config.py) holds them: every field,
    defaults filled in, read as attributes and never changed."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the workflow's arguments are read-only ({name})")

    def __repr__(self) -> str:
        return f"PlainArgs({self._values!r})"


@dataclass(frozen=True)
class PlainTracking:
    """app.yaml's ``server.tracking`` without MLflow (a section with MLflow goes to the models)."""

    tensorboard: bool | None = None
    mlflow: None = None


@dataclass(frozen=True)
class PlainServer:
    """app.yaml's ``server:`` as the models would give it; ``args`` only for a built-in
    workflow (a job's own class validates them with its own ``Args`` model)."""

    workflow: str
    initial_model: str | None = None
    args: PlainArgs | None = None
    tracking: PlainTracking = field(default_factory=PlainTracking)


@dataclass(frozen=True)
class PlainApp:
    """What a site worker, or the check of a job folder, reads of an app.yaml this module
    vouched for: no privacy section."""

    site: PlainSite | None
    privacy: None = None
    server: PlainServer | None = None


class Unvouched(AtollError):
    """Outside what this module checks: the models decide (never leaves vouch())."""

    exit_code = EXIT_INVALID


# Each field: (kind, required, default, bounds). Kinds: "int", "float", "str", "bool",
# ("literal", values), "dict", "list[str]"; "?" after a kind: None is allowed too. Bounds as
# pydantic's Field: ge, gt, lt, min_length. Kept equal to fl/app_config.py by the unit test.
_ROUND = {
    "min_clients": ("int?", False, None, {"ge": 1}),
    "round_timeout": ("float?", False, None, {"gt": 0}),
}
_FEDAVG = {
    **_ROUND,
    "num_rounds": ("int", True, None, {"ge": 1}),
    "key_metric": ("str", False, "accuracy", {"min_length": 1}),
    "key_metric_mode": (("literal", ("max", "min")), False, "max", {}),
    "evaluate_every": ("int", False, 1, {"ge": 0}),
    "cross_site_eval": (("literal", ("none", "global", "all")), False, "global", {}),
    "aggregator": (("literal", ("weighted_mean", "median", "trimmed_mean")), False,
                   "weighted_mean", {}),
    "trim_fraction": ("float", False, 0.2, {"ge": 0, "lt": 0.5}),
    "accumulator": (("literal", ("memory", "disk")), False, "memory", {}),
}
WORKFLOW_FIELDS: dict[str, dict[str, tuple]] = {
    "fedavg": _FEDAVG,
    "fedprox": {**_FEDAVG, "mu": ("float", False, 0.01, {"ge": 0})},
    "fedopt": {
        **_FEDAVG,
        "optimizer": (("literal", ("adam", "yogi", "adagrad")), False, "adam", {}),
        "server_lr": ("float", False, 0.1, {"gt": 0}),
        "beta1": ("float", False, 0.9, {"ge": 0, "lt": 1}),
        "beta2": ("float", False, 0.99, {"ge": 0, "lt": 1}),
        "tau": ("float", False, 1e-3, {"gt": 0}),
    },
    "scatter_gather": {
        **_ROUND,
        "num_rounds": ("int", False, 1, {"ge": 1}),
        "payload_bytes": ("int", False, 1024, {"ge": 0}),
        "topic": ("str", False, "train", {"min_length": 1}),
    },
}
# The sections' own fields (their validators are the functions below); "section" and
# "object" fields are checked by the code that follows, not by _value.
SECTION_FIELDS: dict[str, dict[str, tuple]] = {
    "server": {
        "workflow": ("str", True, None, {}),
        "args": ("dict", False, {}, {}),
        "initial_model": ("str?", False, None, {}),
        "tracking": ("section", False, None, {}),
    },
    "tracking": {
        "tensorboard": ("bool?", False, None, {}),
        "mlflow": ("object?", False, None, {}),
    },
    "site": {
        "script": ("str", True, None, {}),
        "args": ("list[str]", False, [], {}),
        "config": ("dict", False, {}, {}),
    },
}


def _value(value: Any, kind: Any, bounds: dict[str, Any]) -> None:
    """Raise Unvouched unless ``value`` is of ``kind`` within ``bounds`` as strict pydantic
    takes it (exact types: a bool is no int, an int is a float, a float is no int)."""
    if isinstance(kind, str) and kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    if isinstance(kind, tuple):  # ("literal", values): strings only here
        if type(value) is not str or value not in kind[1]:
            raise Unvouched
        return
    if kind == "int":
        ok = type(value) is int
    elif kind == "float":
        ok = type(value) in (int, float) and math.isfinite(value)
    elif kind == "str":
        ok = type(value) is str
    elif kind == "bool":
        ok = type(value) is bool
    elif kind == "dict":
        ok = type(value) is dict and all(type(k) is str for k in value)
    elif kind == "list[str]":
        ok = type(value) is list and all(type(v) is str for v in value)
    else:
        ok = False
    if not ok:
        raise Unvouched
    if "ge" in bounds and not value >= bounds["ge"]:
        raise Unvouched
    if "gt" in bounds and not value > bounds["gt"]:
        raise Unvouched
    if "lt" in bounds and not value < bounds["lt"]:
        raise Unvouched
    if "min_length" in bounds and not len(value) >= bounds["min_length"]:
        raise Unvouched


def _fields(data: Any, fields: dict[str, tuple]) -> dict[str, Any]:
    """A mapping's values with defaults filled in; Unvouched on anything not in ``fields``."""
    if type(data) is not dict or not set(data) <= set(fields):
        raise Unvouched
    out = {}
    for name, (kind, required, default, bounds) in fields.items():
        if name not in data:
            if required:
                raise Unvouched
            out[name] = default
            continue
        value = data[name]
        if kind not in ("section", "object?"):
            _value(value, kind, bounds)
        if kind in ("float", "float?") and type(value) is int:
            value = float(value)  # as the models hold it: 3600 -> 3600.0
        out[name] = value
    return out


def _relative(value: str, suffixes: tuple[str, ...]) -> None:
    try:
        relative_file(value, suffixes)
    except ValueError:
        raise Unvouched from None


def _server(data: Any) -> PlainServer:
    server = _fields(data, SECTION_FIELDS["server"])
    tracking = PlainTracking()
    if "tracking" in data:  # absent: the models' default; null is refused by them
        section = _fields(data["tracking"], SECTION_FIELDS["tracking"])
        if section["mlflow"] is not None:
            raise Unvouched
        tracking = PlainTracking(section["tensorboard"])
    workflow = server["workflow"]
    custom = custom_workflow(workflow)
    args = None
    if custom is None:
        if workflow not in WORKFLOW_FIELDS:
            raise Unvouched
        args = PlainArgs(_fields(server["args"], WORKFLOW_FIELDS[workflow]))
    else:  # the class's own Args are checked by the server worker that loads it
        _relative(custom[0], (".py",))
        if not custom[1].isidentifier():
            raise Unvouched
    model = server["initial_model"]
    if model is not None:
        file, colon, function = model.partition(":")
        if not colon:
            _relative(model, (".safetensors",))
        else:
            _relative(file, (".py",))
            if not function.isidentifier():
                raise Unvouched
    return PlainServer(workflow, model, args, tracking)


def vouch(data: Any) -> PlainApp | None:
    """The site's view of a loaded app.yaml when it passes every rule of the models, else None
    (the models decide: they accept it or name each problem)."""
    if data is None:
        data = {}
    try:
        if type(data) is not dict or not set(data) <= {"server", "site", "privacy"}:
            raise Unvouched
        if data.get("privacy") is not None:
            raise Unvouched
        server = _server(data["server"]) if data.get("server") is not None else None
        site = None
        if data.get("site") is not None:
            section = _fields(data["site"], SECTION_FIELDS["site"])
            _relative(section["script"], (".py",))
            site = PlainSite(section["script"], list(section["args"]), dict(section["config"]))
        return PlainApp(site, server=server)
    except Unvouched:
        return None
    except Exception:  # noqa: BLE001 - an odd value (an unhashable key...): the models decide
        return None
