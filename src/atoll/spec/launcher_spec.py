"""The job-settable backend topology (meta.json ``launcher_spec``) and its rules.

``{"default" | <site> | "server": {"process" | "docker" | "k8s" | "slurm": {...}}}``. For one
target and the site's backend, the ``default`` block is merged under the target's block (the
target wins). Each backend has an allowlist of keys a job may set (the models below); anything
else (``privileged``, ``partition``, ``volumes``...) is rejected with the allowed keys. Blocks for
other backends are validated but ignored at a site that does not run them. In ``launcher_spec``,
``default`` is the shared block (FLARE's key), so a site literally named ``default`` cannot have
a block of its own here.

Checked at submit (``launcher_spec_issues``): allowlists and types; a resource given both
portably (resource_spec) and natively is a conflict; Slurm topology (``nodes * gpus_per_node``
equals ``num_of_gpus``; multi-node GPU jobs need ``gpus_per_node``). Checked at the site
(``resolve_launcher_spec``): the same, plus ``pending_timeout`` may only lower the site's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field, field_validator

from atoll.spec.errors import Issue, SpecError, describe, join_path
from atoll.spec.model import NULL_HINT, NoNullModel, check_fields, validate_into
from atoll.spec.names import ALL_SITES, SERVER, is_site_name
from atoll.spec.quantity import (
    docker_size_to_bytes,
    k8s_quantity,
    k8s_quantity_value,
    slurm_mem_to_mib,
)
from atoll.spec.resources import requested_resources

BACKENDS = ("process", "docker", "k8s", "slurm")
DEFAULT_BLOCK = "default"

_SLURM_TIME_RE = re.compile(
    r"^(?:(\d+)-(\d{1,2})(?::(\d{1,2})(?::(\d{1,2}))?)?|(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?)$"
)


def slurm_time_to_seconds(value: str) -> int:
    """Slurm's ``--time`` formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S. Raises ValueError."""
    match = _SLURM_TIME_RE.fullmatch(value)
    if not match:
        raise ValueError(
            f"{value!r} is not a Slurm time; write minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, "
            "for example 2:00:00"
        )
    d, dh, dm, ds, a, b, c = (int(g) if g else 0 for g in match.groups())
    if match.group(1) is not None:
        return ((d * 24 + dh) * 60 + dm) * 60 + ds
    if match.group(7) is not None:  # H:M:S
        return (a * 60 + b) * 60 + c
    if match.group(6) is not None:  # M:S
        return a * 60 + b
    return a * 60  # minutes


def _positive_slurm_time(value: str) -> str:
    if slurm_time_to_seconds(value) <= 0:
        raise ValueError("must be longer than zero (Slurm reads 0 as 'no limit')")
    return value


def _not_null(value: Any) -> Any:
    """Before-validators run ahead of NoNullModel's own: keep its message for null."""
    if value is None:
        raise ValueError(NULL_HINT)
    return value


def _processes_per_node() -> Any:
    return Field(
        None, ge=1, le=1024,
        description=("Processes (torch.distributed ranks) on each node, like torchrun "
                     "--nproc-per-node; default one per GPU of the node, else 1"),
    )


class ProcessJobSpec(NoNullModel):
    """Process keys a job may set; resources come from resource_spec."""

    processes_per_node: int | None = _processes_per_node()


class DockerJobSpec(NoNullModel):
    """Docker keys a job may set."""

    image: str | None = Field(
        None,
        min_length=1,
        description="Image for the worker; only one the site allows (allow_job_images)",
    )
    shm_size: int | str | None = Field(
        None,
        description="Size of /dev/shm: bytes, a Docker size (512m, 8g, 1.5g) or 2Gi",
    )
    num_of_gpus: int | None = Field(
        None, ge=0, description="GPUs for the worker; instead of resource_spec num_of_gpus"
    )
    processes_per_node: int | None = _processes_per_node()

    @field_validator("shm_size", mode="before")  # one error at the field, not one per type
    @classmethod
    def _shm(cls, value: Any) -> Any:
        docker_size_to_bytes(_not_null(value))
        return value


class K8sJobSpec(NoNullModel):
    """Kubernetes keys a job may set: limits (``cpu``, ``memory``) and requests."""

    image: str | None = Field(
        None,
        min_length=1,
        description="Image for the worker; only one the site allows (allow_job_images)",
    )
    cpu: int | float | str | None = Field(
        None, description='CPU limit (and request unless cpu_request is given), e.g. "2"'
    )
    memory: str | None = Field(
        None, description="Memory limit (and request unless memory_request is given), e.g. 8Gi"
    )
    cpu_request: int | float | str | None = Field(
        None, description='CPU request, e.g. "500m"; alone it sets no limit'
    )
    memory_request: str | None = Field(
        None, description="Memory request, e.g. 4Gi; alone it sets no limit"
    )
    ephemeral_storage: str | None = Field(
        None, description="Ephemeral storage request and limit, e.g. 20Gi"
    )
    num_of_gpus: int | None = Field(
        None, ge=0, description="GPUs for the pod; instead of resource_spec num_of_gpus"
    )
    pending_timeout: int | None = Field(
        None, ge=1, description="Seconds the pod may stay Pending; at most the site's value"
    )
    processes_per_node: int | None = _processes_per_node()

    @field_validator(
        "cpu", "memory", "cpu_request", "memory_request", "ephemeral_storage", mode="before"
    )
    @classmethod
    def _quantity(cls, value: Any) -> str:
        return k8s_quantity(_not_null(value))


class SlurmJobSpec(NoNullModel):
    """Slurm keys a job may set."""

    nodes: int | None = Field(None, ge=1, le=100_000, description="Number of nodes (--nodes)")
    gpus_per_node: int | None = Field(
        None, ge=0, description="GPUs on each node; nodes * gpus_per_node must equal num_of_gpus"
    )
    cpus_per_node: int | None = Field(
        None, ge=1, description="CPUs on each node; instead of resource_spec num_of_cpus"
    )
    mem_per_node: int | str | None = Field(
        None,
        description="Memory on each node: MiB as an integer (32768) or 32Gi; instead of memory",
    )
    time: str | None = Field(None, description="Wall-clock limit (--time), e.g. 2:00:00")
    pending_timeout: int | None = Field(
        None, ge=1, description="Seconds the job may stay PENDING; at most the site's value"
    )
    processes_per_node: int | None = _processes_per_node()

    @field_validator("mem_per_node", mode="before")
    @classmethod
    def _mem(cls, value: Any) -> Any:
        slurm_mem_to_mib(_not_null(value))
        return value

    _time = check_fields(_positive_slurm_time, "time")


JOB_SPEC_MODELS: dict[str, type[NoNullModel]] = {
    "process": ProcessJobSpec,
    "docker": DockerJobSpec,
    "k8s": K8sJobSpec,
    "slurm": SlurmJobSpec,
}
ALLOWED_KEYS: dict[str, tuple[str, ...]] = {
    b: tuple(m.model_fields) for b, m in JOB_SPEC_MODELS.items()
}

# Native field -> the portable resource_spec key it duplicates (a conflict when both are given).
_CONFLICTS: dict[str, dict[str, str]] = {
    "docker": {"num_of_gpus": "num_of_gpus"},
    "k8s": {
        "cpu": "num_of_cpus",
        "cpu_request": "num_of_cpus",
        "memory": "memory",
        "memory_request": "memory",
        "num_of_gpus": "num_of_gpus",
    },
    "slurm": {"cpus_per_node": "num_of_cpus", "mem_per_node": "memory"},
}
# FLARE 2.9 keys a job may not set here, and why (docs/job-format.md lists them).
_REFUSED_FLARE_KEYS: dict[str, dict[str, str]] = {
    "docker": {
        "python_path": "the worker's command is the launcher's (it authenticates the worker)",
        "entrypoint": "the worker's command is the launcher's (it authenticates the worker)",
    },
    "k8s": {
        "python_path": "the worker's command is the launcher's; the site sets k8s.python",
    },
    "slurm": {
        "image": "an image on Slurm is a file on the site's hosts, which a job may not pick; "
        "the site maps one per study (studies.<study>.container.image)",
        "additional_node_command": "a job may not add commands to the site's batch script",
    },
}


def validate_launcher_spec(spec: Any, path: str = "launcher_spec") -> list[Issue]:
    """Shape, allowlists and types of a ``launcher_spec`` document; never raises."""
    if not isinstance(spec, dict):
        return [
            Issue(
                path, f"must be a mapping of 'default' or a site to backends, not {describe(spec)}"
            )
        ]
    issues: list[Issue] = []
    for key, blocks in spec.items():
        where = join_path(path, str(key))
        if key != DEFAULT_BLOCK and key != SERVER and not is_site_name(key):
            issues.append(
                Issue(where, f"{describe(key)} is not 'default', 'server' or a site name")
            )
            continue
        if not isinstance(blocks, dict):
            issues.append(
                Issue(
                    where,
                    f"must be a mapping of backend to settings ({', '.join(BACKENDS)}), not {describe(blocks)}",
                )
            )
            continue
        for backend, block in blocks.items():
            at = join_path(where, str(backend))
            model = JOB_SPEC_MODELS.get(backend) if isinstance(backend, str) else None
            if model is None:
                issues.append(Issue(at, f"unknown launcher; use one of {', '.join(BACKENDS)}"))
                continue
            found = validate_into(model, block, at)[1]
            issues += [_name_backend(i, backend) for i in found]
    return issues


def _name_backend(issue: Issue, backend: str) -> Issue:
    key = issue.path.rsplit(".", 1)[-1]
    reason = _REFUSED_FLARE_KEYS.get(backend, {}).get(key)
    if issue.message.startswith("unknown key") and reason:
        return Issue(issue.path, f"accepted by NVIDIA FLARE but not by atoll: {reason}")
    if issue.message.startswith("unknown key"):
        allowed = ALLOWED_KEYS[backend]
        keys = f"allowed keys: {', '.join(allowed)}" if allowed else "it takes no job settings"
        return Issue(issue.path, f"not settable by a job for the {backend} launcher; {keys}")
    return issue


def merged_block(spec: Mapping[str, Any] | None, target: str, backend: str) -> dict[str, Any]:
    """``default`` then ``target`` for one backend (the target's keys win)."""
    spec = spec or {}
    merged = dict((spec.get(DEFAULT_BLOCK) or {}).get(backend) or {})
    if target != DEFAULT_BLOCK:
        merged.update((spec.get(target) or {}).get(backend) or {})
    return merged


def _where(spec: Mapping[str, Any], target: str, backend: str, key: str) -> str:
    own = (spec.get(target) or {}).get(backend) or {}
    block = target if target != DEFAULT_BLOCK and key in own else DEFAULT_BLOCK
    return join_path("launcher_spec", block, backend, key)


def target_issues(
    launcher_spec: Mapping[str, Any] | None,
    resource_spec: Mapping[str, Any] | None,
    target: str,
    backend: str,
) -> list[Issue]:
    """Conflicts and Slurm topology for one target on one backend (specs already valid)."""
    spec = launcher_spec or {}
    native = merged_block(spec, target, backend)
    portable = requested_resources(resource_spec, target)
    who = (
        "every site"
        if target == ALL_SITES
        else f"{'the server' if target == SERVER else 'site ' + repr(target)}"
    )
    issues = []
    for field, key in _CONFLICTS.get(backend, {}).items():
        if field in native and key in portable:
            issues.append(
                Issue(
                    _where(spec, target, backend, field),
                    (
                        f"for {who} on {backend}, {field} conflicts with resource_spec {key} "
                        f"({describe(portable[key])}); give it in one place: remove {field} or {key}"
                    ),
                )
            )
    if backend == "k8s":
        issues += _k8s_requests(spec, target, who, native)
    if backend == "slurm":
        issues += _slurm_topology(spec, target, who, native, portable)
    return issues


def _k8s_requests(spec: Mapping[str, Any], target: str, who: str, native: dict) -> list[Issue]:
    """A request above its limit (after ``default`` is merged): the API server refuses the pod."""
    issues = []
    for limit, request in (("cpu", "cpu_request"), ("memory", "memory_request")):
        low, high = native.get(request), native.get(limit)
        if low is not None and high is not None and (
            k8s_quantity_value(str(low)) > k8s_quantity_value(str(high))
        ):
            issues.append(Issue(_where(spec, target, "k8s", request), (
                f"for {who} on k8s, {request} {low} is above the {limit} limit {high}; "
                f"Kubernetes refuses a request above its limit: lower {request} or raise {limit}")))
    return issues


def _slurm_topology(
    spec: Mapping[str, Any], target: str, who: str, native: dict, portable: dict
) -> list[Issue]:
    nodes = native.get("nodes", 1)
    per_node = native.get("gpus_per_node")
    total = portable.get("num_of_gpus")
    if per_node is not None and total is not None and nodes * per_node != total:
        return [
            Issue(
                _where(spec, target, "slurm", "gpus_per_node"),
                (
                    f"for {who} on slurm, nodes ({nodes}) * gpus_per_node ({per_node}) = "
                    f"{nodes * per_node} GPUs but resource_spec num_of_gpus is {total}; make them agree"
                ),
            )
        ]
    if nodes > 1 and per_node is None and (total or 0) > 0:
        hint = f"gpus_per_node: {total // nodes}" if total % nodes == 0 else "gpus_per_node"
        return [
            Issue(
                _where(spec, target, "slurm", "nodes"),
                (
                    f"for {who} on slurm, a multi-node GPU job ({nodes} nodes, {total} GPUs) needs "
                    f"gpus_per_node; add {hint}"
                ),
            )
        ]
    return []


def launcher_spec_issues(
    launcher_spec: Mapping[str, Any] | None,
    resource_spec: Mapping[str, Any] | None,
    targets: Iterable[str],
) -> list[Issue]:
    """Submit-time cross checks for the given explicit targets, every block and every backend.

    ``@ALL`` among the targets stands for sites not named anywhere: ``default`` blocks only.
    """
    spec = launcher_spec or {}
    names = [t for t in dict.fromkeys([*targets, *spec]) if t != DEFAULT_BLOCK]
    issues: list[Issue] = []
    for target in names:
        backends = set(spec.get(DEFAULT_BLOCK) or {}) | set(spec.get(target) or {})
        for backend in sorted(b for b in backends if b in BACKENDS):
            issues += target_issues(spec, resource_spec, target, backend)
    return list(dict.fromkeys(issues))


def resolve_launcher_spec(meta: Any, target: str, backend: str, site_config: Any) -> dict[str, Any]:
    """The job's merged block for this site's backend, checked against the site's limits.

    ``meta`` is a JobMeta; ``site_config`` a SiteConfig. Raises SpecError with every problem.
    """
    spec = meta.launcher_spec or {}
    issues = validate_launcher_spec(spec)
    if not issues:
        issues = target_issues(spec, meta.resource_spec, target, backend)
    merged = merged_block(spec, target, backend)
    settings = site_config.settings if site_config is not None else None
    limit = getattr(settings, "pending_timeout", None)
    asked = merged.get("pending_timeout")
    if isinstance(asked, int) and limit is not None and asked > limit:
        issues.append(
            Issue(
                _where(spec, target, backend, "pending_timeout"),
                (
                    f"{asked} s is above this site's {backend} pending_timeout of {limit} s; "
                    f"a job may only lower it: write at most {limit}"
                ),
            )
        )
    if issues:
        raise SpecError(issues)
    return merged
