"""NVIDIA FLARE 2.9 spellings of ``local/study_runtime.yaml``, and the checks FLARE makes there.

``spec.study_runtime`` calls ``normalize_flare_study_runtime`` on the parsed YAML before its own
validation, so a FLARE site's file reads the same here:

- ``env`` values written as YAML numbers or booleans become text (``true`` -> ``"true"``, as
  FLARE writes them, not Python's ``"True"``);
- ``secret_env`` on docker, process and slurm: FLARE's ``{source: VARIABLE}`` (``key`` unused,
  or absent on Slurm) means atoll's ``{source: env, key: VARIABLE}``: the value is read from the
  site parent's environment at launch, never written here;
- a dataset's ``type: mount`` is the default; ``type: databricks`` is reserved by FLARE and
  refused as not supported, any other type as unknown.

And for a Slurm site (``slurm_issues``): names Slurm, Apptainer and the batch shell own
(``SLURM_*``, ``APPTAINER_*``, ``APPTAINERENV_*``, ``SINGULARITY_*``, ``SINGULARITYENV_*``,
``BASHOPTS``, ``EUID``, ``SHELLOPTS``, ``UID``) may not be set by ``env`` or ``secret_env``; a
study whose ``slurm.sandbox`` is ``none`` may not name a ``container`` or ``secret_mounts``; a mount's path may not
hold ':', ',' or a newline, nor a secret mount land under /proc, /sys or /dev.
"""

from __future__ import annotations

import re
from typing import Any

from atoll.spec.errors import Issue, join_path

SECRET_FROM_ENV = "env"
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DATASET_TYPE = "mount"
RESERVED_DATASET_TYPES = ("databricks",)
SLURM_RESERVED_ENV = frozenset({"BASHOPTS", "EUID", "SHELLOPTS", "UID"})
SLURM_RESERVED_PREFIXES = (
    "SLURM_", "APPTAINER_", "APPTAINERENV_", "SINGULARITY_", "SINGULARITYENV_",
)


def env_text(value: Any) -> Any:
    """A scalar ``env`` value as the text the worker sees; anything else is left to the model."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def normalize_flare_study_runtime(data: Any, launcher: str | None) -> tuple[Any, list[Issue]]:
    """``(canonical document, issues)``; the input is not changed."""
    if not isinstance(data, dict) or not isinstance(data.get("studies"), dict):
        return data, []
    issues: list[Issue] = []
    studies = {}
    for study, entry in data["studies"].items():
        if isinstance(entry, dict):
            entry, found = _entry(entry, launcher, join_path("studies", str(study)))
            issues += found
        studies[study] = entry
    return {**data, "studies": studies}, issues


def _entry(entry: dict[str, Any], launcher: str | None, at: str) -> tuple[dict, list[Issue]]:
    entry = dict(entry)
    issues: list[Issue] = []
    if isinstance(entry.get("env"), dict):
        entry["env"] = {name: env_text(value) for name, value in entry["env"].items()}
    if isinstance(entry.get("secret_env"), dict) and launcher not in (None, "k8s"):
        entry["secret_env"] = {name: _from_parent_env(ref)
                               for name, ref in entry["secret_env"].items()}
    if isinstance(entry.get("datasets"), dict):
        datasets = {}
        for name, dataset in entry["datasets"].items():
            if isinstance(dataset, dict) and "type" in dataset:
                kind, dataset = dataset["type"], {k: v for k, v in dataset.items() if k != "type"}
                where = join_path(at, "datasets", str(name), "type")
                if kind in RESERVED_DATASET_TYPES:
                    issues.append(Issue(where, f"{kind!r} datasets are reserved by NVIDIA FLARE "
                                        "and not yet supported; mount the data (type: mount)"))
                elif kind != DATASET_TYPE:
                    issues.append(Issue(where, f"unknown dataset type {kind!r}; the only one is "
                                        f"{DATASET_TYPE!r} (the default)"))
            datasets[name] = dataset
        entry["datasets"] = datasets
    return entry, issues


def _from_parent_env(ref: Any) -> Any:
    """FLARE's ``{source: VARIABLE[, key: ...]}`` -> atoll's ``{source: env, key: VARIABLE}``."""
    if not isinstance(ref, dict) or ref.get("source") == SECRET_FROM_ENV:
        return ref
    source = ref.get("source")
    if not isinstance(source, str) or not _VARIABLE.fullmatch(source) or set(ref) - {
        "source", "key"
    }:
        return ref  # not FLARE's form either: the model names what is wrong
    return {"source": SECRET_FROM_ENV, "key": source}


def slurm_issues(data: Any) -> list[Issue]:
    """The Slurm-only rules FLARE 2.9 checks in study_runtime.yaml (see the module's doc)."""
    studies = data.get("studies") if isinstance(data, dict) else None
    if not isinstance(studies, dict):
        return []
    issues = []
    for study, entry in studies.items():
        if not isinstance(entry, dict):
            continue
        at = join_path("studies", str(study))
        for field in ("env", "secret_env"):
            names = entry.get(field)
            for name in names if isinstance(names, dict) else ():
                if name in SLURM_RESERVED_ENV or str(name).startswith(SLURM_RESERVED_PREFIXES):
                    issues.append(Issue(join_path(at, field, str(name)), (
                        f"{name} belongs to Slurm, Apptainer or the batch shell on a Slurm "
                        "site; pick another name")))
        issues += _slurm_mount_issues(entry, at)
        slurm = entry.get("slurm")
        bare = isinstance(slurm, dict) and slurm.get("sandbox") == "none"
        for field in ("container", "secret_mounts") if bare else ():
            if field in entry:
                issues.append(Issue(join_path(at, field), (
                    f"slurm.sandbox none runs the worker bare on the node, with no container "
                    f"for {field}; set slurm.sandbox to apptainer or pyxis, or remove {field}")))
    return issues


SLURM_FORBIDDEN_DESTINATIONS = ("/proc", "/sys", "/dev")


def _slurm_mount_issues(entry: dict[str, Any], at: str) -> list[Issue]:
    """Apptainer's --bind and Pyxis's --container-mounts split on ':' and ','; a mount over
    /proc, /sys or /dev would replace the container's own (FLARE's slurm/config.py rules)."""
    issues = []
    paths = []
    for field, keys in (("datasets", ("source",)), ("secret_mounts", ("source", "mount_path"))):
        items = entry.get(field)
        for name, item in items.items() if isinstance(items, dict) else ():
            for key in keys:
                value = item.get(key) if isinstance(item, dict) else None
                if isinstance(value, str):
                    paths.append((join_path(at, field, str(name), key), key, value))
    for where, key, value in paths:
        if any(c in value for c in ":,\n\r"):
            issues.append(Issue(where, "contains ':', ',' or a newline, which Slurm's container "
                                "mounts (--bind, --container-mounts) cannot carry; rename it"))
        elif key == "mount_path" and any(
            value.rstrip("/") == root or value.startswith(root + "/")
            for root in SLURM_FORBIDDEN_DESTINATIONS
        ):
            issues.append(Issue(where, f"{value} is under /proc, /sys or /dev, which the "
                                "container needs for itself; pick another path"))
    return issues
