"""What each study's jobs may use at this site: ``local/study_runtime.yaml`` (format_version 2).

Owned by the site operator and re-read at every launch. Strict: unknown keys, a field of another
launcher than the site's, launcher-owned environment names, empty env values, a name in both
``env`` and ``secret_env``, launcher-owned Docker kwargs and template paths leaving ``local/`` are
errors naming the YAML path; every error of the file is reported at once.

Secrets are references only: a Kubernetes Secret name and key (k8s launcher), or ``source: env``
and the name of a variable in the site parent's own environment (the other launchers). A dataset
``source`` is a PVC name on k8s and an absolute host path elsewhere; a dataset is mounted at
``/data/<study>/<dataset>`` in containers and process sandboxes (an unconfined process launcher
passes host paths instead).

Confinement is checked here, at load, so ``atoll site validate`` reports it: ``docker_kwargs``
(spec/docker_kwargs.py) and ``pod_template`` (spec/pod_template.py) may not hand the host to the
job, and on docker and process sites a dataset or secret mount may not be, hold or lie inside the
site kit (spec/kit_paths.py).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from atoll.spec.docker_kwargs import docker_kwargs_issues
from atoll.spec.errors import Issue, IssuesError, SpecError, describe
from atoll.spec.flare_study_runtime import normalize_flare_study_runtime, slurm_issues
from atoll.spec.kit_paths import kit_bind_problem
from atoll.spec.model import NoNullModel, validate_into
from atoll.spec.names import check_label, is_env_name, is_label, is_subdomain
from atoll.spec.pod_template import dataset_claims, load_pod_template, pod_template_issues
from atoll.spec.site_config import read_yaml, slurm_directive
from atoll.spec.statistics_rules import StatisticsRules
from atoll.spec.study_runtime_plain import (  # noqa: F401 - the names' home, re-exported
    DATA_ROOT,
    RUNTIME_FILE,
    data_root,
    dataset_mount_path,
)
from atoll.spec.study_runtime_rules import cross_issues
from atoll.spec.worker_env import RESERVED_ENV, RESERVED_ENV_PREFIX

MAX_FINGERPRINT = 200  # a dataset's published fingerprint: a digest and its algorithm, not data
FORMAT_VERSION = 2
# Which launchers read each launcher-specific field; a field of another launcher is an error.
_FIELD_LAUNCHERS = {
    "container": ("docker", "k8s", "slurm"),
    "secret_mounts": ("docker", "k8s", "slurm"),
    "docker_kwargs": ("docker",),
    "pod_template": ("k8s",),
    "slurm": ("slurm",),
}
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
_SURROGATES = re.compile("[\ud800-\udfff]")


def _launcher(info: ValidationInfo) -> str | None:
    return (info.context or {}).get("launcher")


def _host_path_problem(value: str) -> str | None:
    if not value.startswith("/"):
        return "must be an absolute host path, e.g. /srv/data/slides"
    if ".." in PurePosixPath(value).parts:
        return "must not contain '..'; write the path it leads to"
    return None


# The launchers that lend host folders to jobs (k8s mounts PVCs; bare Slurm jobs are not confined).
KIT_CHECKED_LAUNCHERS = ("docker", "process")


def _kit_problem(value: str, info: ValidationInfo) -> str | None:
    """A bind of the site kit would hand the job its key, settings and other jobs' runs."""
    local_dir = (info.context or {}).get("local_dir")
    if _launcher(info) not in KIT_CHECKED_LAUNCHERS or local_dir is None:
        return None
    kit, source = Path(local_dir).resolve().parent, Path(value).resolve()  # links followed
    return kit_bind_problem(source, kit)


class ContainerSpec(NoNullModel):
    """The study's worker image."""

    image: str = Field(min_length=1, description="Image reference, e.g. registry/trainer:1.0")


class Dataset(NoNullModel):
    """One dataset, mounted at /data/<study>/<name>."""

    source: str = Field(min_length=1, description="k8s: a PVC name; others: an absolute host path")
    mode: Literal["ro", "rw"] = Field(description="ro (read-only) or rw; required")
    fingerprint: str | None = Field(
        None, description="A content fingerprint the site chooses to publish in each job's "
        "provenance record (e.g. sha256:...): the site's own statement, printable, at most "
        f"{MAX_FINGERPRINT} characters")

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint(cls, value: str) -> str:
        if not 1 <= len(value) <= MAX_FINGERPRINT or not value.isprintable() \
                or not value.isascii() or value != value.strip():
            raise ValueError(f"a fingerprint is 1 to {MAX_FINGERPRINT} printable ASCII "
                             "characters without leading or trailing spaces, e.g. sha256:<hex>")
        return value

    @field_validator("source")
    @classmethod
    def _source(cls, value: str, info: ValidationInfo) -> str:
        launcher = _launcher(info)
        if launcher == "k8s":
            if not is_subdomain(value):
                raise ValueError(f"{value!r} is not a PVC name (lowercase RFC 1123)")
        elif launcher is not None and (problem := _host_path_problem(value)) is not None:
            raise ValueError(problem)
        elif (problem := _kit_problem(value, info)) is not None:
            raise ValueError(problem)
        return value


class SecretRef(NoNullModel):
    """A reference to a secret value, never the value."""

    source: str = Field(min_length=1, description="k8s: a Secret name; others: the word env")
    key: str = Field(min_length=1, description="k8s: the Secret's key; others: a variable name")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str, info: ValidationInfo) -> str:
        launcher = _launcher(info)
        if launcher == "k8s" and not is_subdomain(value):
            raise ValueError(f"{value!r} is not a Kubernetes Secret name (lowercase RFC 1123)")
        if launcher not in (None, "k8s") and value != "env":
            raise ValueError(
                f"with the {launcher} launcher a secret comes from the site parent's "
                "environment: write source: env and key: <VARIABLE NAME>"
            )
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str, info: ValidationInfo) -> str:
        ok = (
            _SECRET_KEY_RE.fullmatch(value)
            if _launcher(info) == "k8s"
            else re.fullmatch(r"^[A-Za-z_][A-Za-z0-9_]*$", value)
        )
        if not ok:
            raise ValueError(f"{value!r} is not a valid key name")
        return value


class SecretMount(NoNullModel):
    """Secret files mounted read-only into the worker (always read-only)."""

    source: str = Field(min_length=1, description="k8s: a Secret name; others: a host path")
    mount_path: str = Field(min_length=1, description="Absolute path inside the worker")
    mode: Literal["ro"] | None = Field(
        None, description="Always ro (NVIDIA FLARE's key; secret mounts are read-only)"
    )
    items: dict[str, str] | None = Field(
        None, description="k8s: Secret key -> file path to project (default: every key)"
    )

    @field_validator("items")
    @classmethod
    def _items(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if _launcher(info) not in (None, "k8s"):
            raise ValueError("items is Kubernetes-only (a Secret's keys); point source at a "
                             "folder holding only the intended files")
        if not value:
            raise ValueError("is empty; remove items to project every key of the Secret")
        for key, path in value.items():
            if not _SECRET_KEY_RE.fullmatch(key) or not path or path.startswith("/") or (
                ".." in PurePosixPath(path).parts
            ):
                raise ValueError(f"{key}: {path!r} must be a Secret key mapped to a relative "
                                 "file path without '..'")
        return value

    @field_validator("source")
    @classmethod
    def _source(cls, value: str, info: ValidationInfo) -> str:
        launcher = _launcher(info)
        if launcher == "k8s":
            if not is_subdomain(value):
                raise ValueError(f"{value!r} is not a Kubernetes Secret name (lowercase RFC 1123)")
        elif launcher is not None and (problem := _host_path_problem(value)) is not None:
            raise ValueError(problem)
        elif (problem := _kit_problem(value, info)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, value: str) -> str:
        problem = _host_path_problem(value)
        if problem or value.rstrip("/") == "":
            raise ValueError(
                "must be an absolute path inside the worker, e.g. /run/secrets/db, "
                "without '..' and not /"
            )
        return value


class SlurmStudySettings(NoNullModel):
    """Per-study overrides of the site's Slurm settings."""

    sandbox: Literal["none", "apptainer", "pyxis"] | None = Field(
        None, description="Bare, Apptainer or Pyxis; default: the site's slurm.sandbox"
    )
    python_path: str | None = Field(None, min_length=1, description="Python on the nodes/image")
    partition: str | None = Field(None, min_length=1, description="--partition for this study")
    account: str | None = Field(None, min_length=1, description="--account for this study")
    qos: str | None = Field(None, min_length=1, description="--qos for this study")
    setup: str | None = Field(
        None, description="Shell lines the batch script runs before the worker (site-owned)"
    )

    @field_validator("partition", "account", "qos", mode="before")
    @classmethod
    def _directive(cls, value: Any) -> Any:
        return slurm_directive(value)

    @field_validator("setup")
    @classmethod
    def _setup(cls, value: str) -> str:
        if "\0" in value:
            raise ValueError("must not contain NUL")
        return value


class StudyEntry(NoNullModel):
    """What one study's jobs get at this site."""

    container: ContainerSpec | None = Field(None, description="The study's worker image")
    datasets: dict[str, Dataset] = Field(default_factory=dict, description="name -> dataset")
    env: dict[str, str] = Field(default_factory=dict, description="Plain environment variables")
    secret_env: dict[str, SecretRef] = Field(
        default_factory=dict, description="Environment variables from secret references"
    )
    secret_mounts: dict[str, SecretMount] = Field(
        default_factory=dict, description="name -> secret files mounted read-only"
    )
    docker_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra Docker containers.run arguments (docker only)"
    )
    pod_template: dict[str, Any] | None = Field(
        None, description="A Pod manifest (inline, or a file under local/) to start from (k8s)"
    )
    slurm: SlurmStudySettings | None = Field(None, description="Slurm overrides (slurm only)")
    statistics: StatisticsRules | None = Field(
        None, description="Rules for federated statistics at this site (min_count, precision, "
        "max_queries, columns, dp; docs/privacy.md)"
    )

    @field_validator(*_FIELD_LAUNCHERS, mode="before")
    @classmethod
    def _launcher_field(cls, value: Any, info: ValidationInfo) -> Any:
        launcher = _launcher(info)
        owners = _FIELD_LAUNCHERS[info.field_name]
        if launcher is not None and launcher not in owners:
            raise ValueError(
                f"{info.field_name} is read by the {' / '.join(owners)} launcher(s), but this "
                f"site's launcher is {launcher}: remove it"
            )
        if info.field_name == "pod_template" and isinstance(value, str):
            context = info.context or {}
            return load_pod_template(value, context.get("local_dir"), context.get("dataset_claims"))
        return value

    @field_validator("datasets", "secret_mounts")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        issues = [Issue(name, _name_problem(name)) for name in value if not is_label(name)]
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return value
        empty_ok = _launcher(info) == "slurm"  # FLARE 2.9 keeps empty values on Slurm
        issues = [Issue(str(name), p) for name, v in value.items()
                  if (p := _env_problem(name, v, empty_ok))]
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        issues = [Issue(name, p) for name in value if (p := _env_name_problem(name))]
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("docker_kwargs")
    @classmethod
    def _docker_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        issues = docker_kwargs_issues(value)
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("pod_template")
    @classmethod
    def _pod(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if value.get("kind", "Pod") != "Pod":  # FLARE 2.9 accepts a template without kind
            raise ValueError(
                f"must be a Pod manifest with kind: Pod, not kind: {describe(value.get('kind'))}"
            )
        if value.get("apiVersion", "v1") != "v1":
            raise ValueError("a Pod's apiVersion is v1")
        issues = pod_template_issues(value, (info.context or {}).get("dataset_claims"))
        if issues:
            raise IssuesError(issues)
        return value


def _name_problem(name: str) -> str:
    try:
        check_label(name)
    except ValueError as err:
        return str(err)
    return ""


def _env_name_problem(name: Any) -> str | None:
    if not is_env_name(name):
        return (
            f"{describe(name)} is not an environment variable name; use letters, digits and "
            "'_', not starting with a digit"
        )
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
        return f"{name} is set by the launcher (atoll owns {', '.join(sorted(RESERVED_ENV))} and ATOLL_*); remove it"
    return None


def _env_problem(name: Any, value: Any, empty_ok: bool = False) -> str | None:
    if (problem := _env_name_problem(name)) is not None:
        return problem
    if not isinstance(value, str):
        return f"must be a text, number or true/false, not {describe(value)}"
    if "\0" in value or _SURROGATES.search(value):
        return "must be text without NUL or a lone surrogate (\\ud800...)"
    if value == "" and not empty_ok:
        return "empty value; give it a value or remove the variable"
    return None


class StudyRuntime(NoNullModel):
    """The validated ``local/study_runtime.yaml``."""

    format_version: int = Field(description="Always 2")
    studies: dict[str, StudyEntry] = Field(default_factory=dict, description="study -> entry")

    @field_validator("format_version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value != FORMAT_VERSION:
            raise ValueError(
                f"this atoll reads format_version {FORMAT_VERSION}, not {value}; "
                "convert the file as described in docs/site-config.md"
            )
        return value

    def entry(self, study: str) -> StudyEntry | None:
        """The study's entry, or None when the site maps nothing for it."""
        return self.studies.get(study)


def unconfined_studies(site_config: Any, runtime: StudyRuntime) -> list[str]:
    """The studies whose workers run with the site parent's rights: all of them under
    ``process.sandbox: none``; on Slurm, those whose sandbox (the study's ``slurm.sandbox``, else
    the site's) is ``none``: a bare batch job runs as the parent's user."""
    settings = site_config.settings
    if site_config.launcher == "process":
        return sorted(runtime.studies) if settings.sandbox == "none" else []
    if site_config.launcher == "slurm":
        return sorted(name for name, entry in runtime.studies.items()
                      if ((entry.slurm.sandbox if entry.slurm else None) or settings.sandbox)
                      == "none")
    return []


def is_unconfined(site_config: Any) -> bool:
    """Whether site.yaml alone runs workers with the parent's rights (the start's warning)."""
    settings = site_config.settings
    return site_config.launcher in ("process", "slurm") and settings.sandbox == "none"


def unconfined_issues(site_config: Any, runtime: StudyRuntime) -> list[Issue]:
    """A site whose workers run with the parent's rights (``process.sandbox: none``, a bare
    Slurm job) may map one study at most: its jobs could read every other study's data and
    secrets, and other jobs' run folders."""
    unconfined = unconfined_studies(site_config, runtime)
    if not unconfined or len(runtime.studies) <= 1:
        return []
    mapped = f"maps {len(runtime.studies)} studies ({', '.join(sorted(runtime.studies))})"
    if site_config.launcher == "process":
        return [Issue("studies", (
            f"{mapped} while site.yaml sets process.sandbox: none; unconfined workers could "
            "read each other's data and secrets: map one study, or run workers in the sandbox "
            "(docs/security.md)"))]
    return [Issue("studies", (
        f"{mapped} while the workers of {', '.join(unconfined)} run as bare Slurm jobs "
        "(slurm.sandbox: none), with the site parent's rights: they could read the other "
        "studies' data, other jobs' run folders and secrets; map one study, or set "
        "slurm.sandbox to apptainer or pyxis (docs/launchers/slurm.md)"))]


def parse_study_runtime(
    data: Any, launcher: str | None, local_dir: Path | None = None, source: str = RUNTIME_FILE
) -> StudyRuntime:
    """Validate parsed YAML for a site whose launcher is ``launcher``; SpecError lists all."""
    if not isinstance(data, dict):
        raise SpecError(
            [
                Issue(
                    "",
                    f"must be a mapping with format_version: 2 and studies:, not {describe(data)}",
                )
            ],
            source=source,
        )
    data, flare_issues = normalize_flare_study_runtime(data, launcher)
    if launcher == "slurm":
        flare_issues += slurm_issues(data)
    context = {"launcher": launcher, "local_dir": local_dir, "dataset_claims": dataset_claims(data)}
    runtime, issues = validate_into(StudyRuntime, data, context=context)
    issues = sorted(issues + cross_issues(data) + flare_issues, key=lambda i: i.path)
    if issues or runtime is None:
        raise SpecError(issues, source=source)
    return runtime


def load_study_runtime(local_dir: str | Path, launcher: str | None) -> StudyRuntime:
    """Read ``<local_dir>/study_runtime.yaml``; no file means no study maps anything here."""
    local_dir = Path(local_dir)
    path = local_dir / RUNTIME_FILE
    if not path.exists():
        return StudyRuntime(format_version=FORMAT_VERSION)
    return parse_study_runtime(read_yaml(path), launcher, local_dir, str(path))
