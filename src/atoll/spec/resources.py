"""Portable resource requests (meta.json ``resource_spec``) resolved for one target.

``{"@default": {...}, "<site>" | "server": {...}}``: ``@default`` applies to every target, the
server included; a named target overrides only what differs (a shallow merge: an inherited field
can be overridden, never removed, and ``null`` is rejected). ``@default`` accepts only the three
portable keys; a named target may carry other keys, passed through to the site's capacity
accounting (``Resources.extra``). A site literally named ``default`` is an ordinary site.

The blocks' models (pydantic) are made when a resource_spec first has a block to check: a
parent's first job that asks nothing (the common case) resolves to the defaults without them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from atoll.spec.errors import Issue, SpecError, describe, join_path
from atoll.spec.names import SERVER, is_site_name

DEFAULT_KEY = "@default"
RESOURCE_KEYS = ("num_of_gpus", "num_of_cpus", "memory")
DEFAULT_CPUS = 1


@dataclass(frozen=True)
class Resources:
    """What one target (a site or ``server``) asked for, after ``@default`` is merged in."""

    num_of_gpus: int = 0
    # None when the job did not ask: no CPU limit on a container, pod or Slurm task (as
    # NVIDIA FLARE 2.9); admission still counts it as DEFAULT_CPUS (``cpus_counted``).
    num_of_cpus: int | None = None
    memory: str | None = None  # as written: "64Gi"; None when the job did not ask
    # Other per-site keys pass through to the site's capacity accounting.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Slurm launcher_spec nodes: num_of_cpus and memory are per node (NVIDIA FLARE 2.9).
    nodes: int = 1

    @property
    def cpus_counted(self) -> int:
        """CPUs this worker holds in a site's capacity accounting, over all its nodes."""
        return (DEFAULT_CPUS if self.num_of_cpus is None else self.num_of_cpus) * self.nodes

    @property
    def memory_counted(self) -> int | None:
        """Bytes this worker holds in a site's capacity accounting, over all its nodes."""
        per_node = self.memory_bytes
        return None if per_node is None else per_node * self.nodes

    @property
    def memory_bytes(self) -> int | None:
        from atoll.spec.quantity import memory_to_bytes

        return None if self.memory is None else memory_to_bytes(self.memory)


_NULL_HINT = "null is not allowed; remove the key to inherit the value from @default"


@functools.cache
def _models() -> tuple[type, type]:
    """The models of a ``@default`` block and of a target's block, made at their first use."""
    from pydantic import ConfigDict, Field, field_validator

    from atoll.spec.model import NoNullModel
    from atoll.spec.quantity import check_memory

    class DefaultResources(NoNullModel):
        """``resource_spec["@default"]``: only the three portable keys."""

        null_hint: ClassVar[str] = _NULL_HINT

        num_of_gpus: int | None = Field(
            None, ge=0,
            description="GPUs for the worker (an integer >= 0; true/false are not numbers)")
        num_of_cpus: int | None = Field(
            None, ge=1, description="Schedulable CPU units for the worker (an integer >= 1)"
        )
        memory: str | None = Field(
            None, description="Memory limit: a positive integer with Mi, Gi or Ti, e.g. 64Gi"
        )

        @field_validator("memory")
        @classmethod
        def _memory(cls, value: str | None) -> str | None:
            return None if value is None else check_memory(value)

    class TargetResources(DefaultResources):
        """``resource_spec[<site>|"server"]``: the portable keys plus pass-through capacity keys."""

        model_config = ConfigDict(extra="allow")

    return DefaultResources, TargetResources


def _block_issues(block: Any, where: str, target: bool) -> list[Issue]:
    from atoll.spec.model import validate_into

    default_block, target_block = _models()
    return validate_into(target_block if target else default_block, block, where)[1]


def validate_resource_spec(spec: Any, path: str = "resource_spec") -> list[Issue]:
    """Every problem of a ``resource_spec`` document (empty when valid); never raises."""
    if not isinstance(spec, dict):
        return [Issue(path, f"must be a mapping of target name to resources, not {describe(spec)}")]
    issues: list[Issue] = []
    for key, block in spec.items():
        where = join_path(path, str(key))
        if key == DEFAULT_KEY:
            issues += _block_issues(block, where, target=False)
        elif not isinstance(key, str) or key.startswith("@"):
            issues.append(Issue(where, "unknown special key; the only one is @default"))
        elif key != SERVER and not is_site_name(key):
            issues.append(Issue(where, f"{key!r} is not a site name (or 'server')"))
        else:
            issues += _block_issues(block, where, target=True)
            extra = block.items() if isinstance(block, dict) else []
            issues += [
                Issue(join_path(where, k), _NULL_HINT.replace(" from @default", ""))
                for k, v in extra
                if v is None and k not in RESOURCE_KEYS
            ]
    return issues


def requested_resources(spec: Mapping[str, Any] | None, target: str) -> dict[str, Any]:
    """The keys the job gave for ``target`` (``@default`` merged under the target's own block).

    Only what was written: conflict checks need to know whether a value was given at all.
    """
    spec = spec or {}
    merged: dict[str, Any] = dict(spec.get(DEFAULT_KEY) or {})
    merged.update(spec.get(target) or {})
    return merged


def resolve_resources(
    spec: Mapping[str, Any] | None, target: str, native: Mapping[str, Any] | None = None
) -> Resources:
    """Resources for one target; raises SpecError listing every problem of the spec.

    ``native`` is the job's launcher_spec block for the site's backend: a Docker or Kubernetes
    ``num_of_gpus`` there (NVIDIA FLARE's spelling) is the worker's GPU count.
    """
    issues = validate_resource_spec({} if spec is None else spec)
    if issues:
        raise SpecError(issues)
    merged = requested_resources(spec, target)
    extra = {k: v for k, v in merged.items() if k not in RESOURCE_KEYS}
    gpus = merged.get("num_of_gpus", 0)
    if native and native.get("num_of_gpus") is not None:
        gpus = native["num_of_gpus"]  # never both: a conflict refused at submit
    return Resources(
        num_of_gpus=gpus,
        num_of_cpus=merged.get("num_of_cpus"),
        memory=merged.get("memory"),
        extra=extra,
        nodes=(native or {}).get("nodes") or 1,
    )
