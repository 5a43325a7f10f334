"""From a job and a site's own settings to one LaunchRequest (used by the site parent and render).

Everything a launcher needs is resolved here, once: the target's resources (unless the parent
admitted the job with them already: it passes them on), the job's block of launcher_spec for
this site's backend (checked against the site's limits), the study's entry of
study_runtime.yaml, and the worker's non-secret environment. Problems are collected and raised
together as one SpecError.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.launchers.base import JobIdentity, LaunchError, LaunchRequest
from atoll.launchers.process_options import ProcessSite
from atoll.spec import worker_env as contract  # (worker_env below is this module's)
from atoll.spec.admission import asked_at, capacity_issues
from atoll.spec.errors import Issue, SpecError
from atoll.spec.resources import Resources

if TYPE_CHECKING:  # the models themselves: built by whoever parsed the files
    from atoll.spec.meta_plain import Meta
    from atoll.spec.site_config import SiteConfig
    from atoll.spec.study_runtime import StudyEntry, StudyRuntime

WORKER_ARGS = ("-m", "atoll.worker")
TOKEN_VAR = contract.JOB_TOKEN


def worker_env(identity: JobIdentity, parent_address: str) -> dict[str, str]:
    """The variables every backend gives the worker (backends add ATOLL_WORKDIR and data)."""
    return {
        contract.JOB_ID: identity.job_id,
        contract.ROLE: identity.role,
        contract.SITE: identity.site,
        contract.STUDY: identity.study,
        contract.PARENT: parent_address,
    }


def job_run_folder(site_config: SiteConfig, job_id: str, workspace: Path | None = None) -> Path:
    """Where a job's run folder lives on the parent's host (spec/run_folders.py's rule);
    ``workspace``: the kit's (default: ``<kit>/workspace``)."""
    from atoll.spec.run_folders import run_folder

    if workspace is None:
        workspace = site_config.resolve_path("workspace")
    return run_folder(site_config, workspace, job_id)


def secret_env_values(entry: StudyEntry | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Values of ``secret_env`` with ``source: env`` from the parent's environment.

    The site parent calls it with its own environment and passes the values in
    ``LaunchRequest.credentials`` (each backend's secret channel): the launchers read no
    environment of their own (``launch_credentials``). Raises SpecError naming every missing
    variable, never a value.
    """
    if entry is None:
        return {}
    values, issues = {}, []
    for name, ref in entry.secret_env.items():
        if ref.source != "env":
            continue  # a Kubernetes Secret reference: the Pod reads it itself
        if ref.key in environ:
            values[name] = environ[ref.key]
        else:
            issues.append(
                Issue(
                    f"secret_env.{name}.key",
                    (
                        f"variable {ref.key} is not set in the site parent's environment; "
                        "export it before starting the site"
                    ),
                )
            )
    if issues:
        raise SpecError(issues)
    return values


def launch_credentials(request: LaunchRequest) -> dict[str, str]:
    """What the worker gets through its backend's secret channel: the job token and the value
    of every ``source: env`` secret of its study, all from ``request.credentials``, where the
    site parent put them. LaunchError names whatever is missing, never a value."""
    entry = request.study_runtime
    wanted = [TOKEN_VAR]
    if entry is not None:
        wanted += [name for name, ref in entry.secret_env.items() if ref.source == "env"]
    missing = [name for name in wanted if name not in request.credentials]
    if missing:
        raise LaunchError(
            f"study {request.identity.study}: the launch request carries no value for "
            f"{', '.join(missing)}; the site parent passes the job token and the values of "
            "secret_env (source: env, read from its own environment) in its credentials"
        )
    return dict(request.credentials)


def build_request(
    *,
    meta: Meta,
    identity: JobIdentity,
    site_config: SiteConfig | ProcessSite,
    study_runtime: StudyRuntime | None,
    workdir: Path,
    parent_address: str,
    credentials: Mapping[str, str] | None = None,
    worker_args: tuple[str, ...] = WORKER_ARGS,
    check_capacity: bool = True,
    parent_cert: str | None = None,
    shared_folders: tuple[Path, ...] = (),
    resources: Resources | None = None,
    parent_socket: str | None = None,
) -> LaunchRequest:
    """Resolve everything for ``identity.site`` on this site's launcher; SpecError lists all.

    ``resources``: what the parent already resolved for the target from this meta (the site
    admits a job with them); resolved here when None.

    ``site_config`` a ProcessSite: a process launcher made without a SiteConfig
    (parent/local_config.py ``launch_site``), for a meta without a launcher_spec.
    """
    plain = isinstance(site_config, ProcessSite)
    if plain and meta.launcher_spec:
        raise ValueError("a launcher_spec is resolved against the SiteConfig")
    target = identity.site
    issues: list[Issue] = []
    if meta.app_for(target) is None:
        issues.append(Issue("deploy_map", f"this job deploys no app to {target!r}"))
    if resources is None:
        resources = Resources()
        try:
            resources = asked_at(meta, target, site_config.launcher)
        except SpecError as err:
            issues += err.issues
    spec: dict[str, Any] = {}
    if meta.launcher_spec:  # none asked: its merged block is {} and nothing is checked
        from atoll.spec.launcher_spec import resolve_launcher_spec

        try:
            spec = resolve_launcher_spec(meta, target, site_config.launcher, site_config)
        except SpecError as err:
            issues += err.issues
    if check_capacity and not issues:
        issues += capacity_issues(resources, dict(site_config.capacity) if plain
                                  else site_config.capacity.model_dump())
    if issues:
        raise SpecError(issues)
    entry = study_runtime.entry(identity.study) if study_runtime else None
    rules = {}
    if entry is not None and entry.statistics is not None and identity.role == "site":
        # the site's own rules (spec/statistics_rules.py): the job cannot set them
        rules = {contract.STATISTICS_RULES: entry.statistics.to_env()}
    return LaunchRequest(
        identity=identity,
        resources=resources,
        launcher_spec=spec,
        study_runtime=entry,
        site_config=site_config,
        workdir=Path(workdir),
        parent_address=parent_address,
        worker_env={**worker_env(identity, parent_address),
                    # The parent's endpoint certificate (public) when it speaks TLS.
                    **({contract.PARENT_CERT: parent_cert} if parent_cert else {}),
                    **rules},
        credentials=dict(credentials or {}),
        worker_args=tuple(worker_args),
        shared_folders=tuple(Path(f) for f in shared_folders),
        parent_socket=parent_socket,
    )
