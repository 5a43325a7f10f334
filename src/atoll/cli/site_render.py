"""``atoll site render`` and ``atoll site validate``: an operator's dry run, before any job arrives.

    atoll site render SITE_DIR JOB_DIR --study STUDY [--job-id ID] [--site NAME] [--format json|text]
    atoll site validate SITE_DIR [--format json|text]

SITE_DIR is a site kit folder holding ``local/site.yaml`` and ``local/study_runtime.yaml``.
Exit codes: 0 fine, 2 invalid files or a job this site cannot run (every problem is listed).
Heavy imports happen inside the commands so that ``atoll --help`` stays fast.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import click

from atoll.cli.common import Problem, error_problems, render_error

_dir = click.Path(exists=True, file_okay=False, path_type=Path)
_fmt = click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "text"]),
    default="text",
    show_default=True,
    help="json keeps stdout machine-readable.",
)


TLS_PLACEHOLDER = "<the worker endpoint certificate, made when the parent starts>"


def _load_site(site_dir: Path) -> tuple[Any, Any, list[Problem]]:
    """site.yaml then study_runtime.yaml (checked for the site's launcher), all problems."""
    from atoll.spec.errors import SpecError
    from atoll.spec.site_config import load_site_config, read_yaml
    from atoll.spec.study_runtime import load_study_runtime

    local = site_dir / "local"
    problems: list[Problem] = []
    config = runtime = None
    launcher = None
    try:
        config = load_site_config(local / "site.yaml")
        launcher = config.launcher
    except SpecError as err:
        problems += error_problems(err, "local/site.yaml")
        raw = _quiet(lambda: read_yaml(local / "site.yaml"))
        guess = raw.get("launcher") if isinstance(raw, dict) else None
        launcher = guess if guess in ("process", "docker", "k8s", "slurm") else None
    try:
        runtime = load_study_runtime(local, launcher)
    except SpecError as err:
        problems += error_problems(err, "local/study_runtime.yaml")
    if config is not None and runtime is not None:
        from atoll.spec.study_runtime import unconfined_issues

        problems += error_problems(SpecError(unconfined_issues(config, runtime)),
                                   "local/study_runtime.yaml")
    return config, runtime, problems


def _sandbox_problems(config: Any) -> tuple[str | None, list[Problem]]:
    """The process launcher's sandbox, tried for real: one empty sandbox is started; a Slurm
    site's, as site.yaml sets it (the nodes' Apptainer or Pyxis cannot be tried from here)."""
    if config.launcher == "slurm":
        return _slurm_sandbox_line(config.settings.sandbox), []
    if config.launcher != "process":
        return None, []
    if config.settings.sandbox == "none":
        return "none: workers run with the parent's privileges (docs/security.md)", []
    from atoll.launchers.base import LaunchError
    from atoll.launchers.process import ProcessLauncher

    try:
        host = ProcessLauncher(config, share_cpus=False).sandbox_host()
    except LaunchError as err:
        return None, [{"file": "local/site.yaml", "path": "process.sandbox", "message": str(err)}]
    return f"bwrap ({host.bwrap}): a test sandbox started", []


def _slurm_sandbox_line(sandbox: str) -> str:
    if sandbox != "none":
        return f"{sandbox}: each worker sees its run folder and its study's datasets only"
    import shutil

    found = [name for name in ("apptainer", "enroot") if shutil.which(name)]
    hint = (f"; {found[0]} is installed here: set slurm.sandbox to "
            f"{'apptainer' if found[0] == 'apptainer' else 'pyxis'}" if found else "")
    return ("none: workers run as bare Slurm jobs with the parent's rights, one study at most "
            f"(docs/launchers/slurm.md){hint}")


def _network_line(config: Any) -> str | None:
    """What the process launcher's workers reach (process.network)."""
    if config.launcher != "process":
        return None
    settings = config.settings
    if not settings.isolated_network:
        why = "sandbox: none" if settings.sandbox == "none" else "network: host"
        return (f"host ({why}): workers reach every port of this host and of other jobs "
                "(docs/security.md)")
    allowed = ", ".join(settings.network.allow) or "nothing else"
    return f"isolated: each worker reaches its parent, its job's own ranks and {allowed}"


def _kit_identity(site_dir: Path) -> tuple[str, Path] | None:
    """(the name SITE_DIR's certificate carries, its kit's workspace), the name the running
    parent goes by; None for a folder that holds only local/."""
    from atoll.pki.identity import identity_from_cert
    from atoll.pki.kit import KitError, load_kit

    try:
        kit = load_kit(site_dir)
        return identity_from_cert(kit.cert.read_bytes()).name, kit.workspace
    except (KitError, OSError, ValueError):
        return None


def _run_folder(config: Any, site_dir: Path, kit: tuple[str, Path] | None, site: str,
                job_id: str) -> Path:
    """The worker's run folder, by the rule the running parents follow (spec/run_folders.py)."""
    from atoll.pki.kit import DEFAULT_WORKSPACE
    from atoll.spec.run_folders import run_folder, server_run_folder

    workspace = kit[1] if kit else site_dir.resolve() / DEFAULT_WORKSPACE
    if site == "server":
        return server_run_folder(workspace, job_id)
    return run_folder(config, workspace, job_id)


def _quiet(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _record(site_dir: Path) -> None:
    """What a parent's start would record after its own check (parent/local_record.py); best
    effort: a kit whose workspace cannot be written is checked at its start."""
    from atoll.parent.local_config import record_local_config
    from atoll.spec.errors import SpecError

    local = site_dir / "local"
    try:
        record_local_config(local, True, site_dir / "workspace")
    except (SpecError, OSError):
        pass


@click.command("validate")
@click.argument("site_dir", type=_dir)
@_fmt
def validate_command(site_dir: Path, fmt: str) -> None:
    """Check SITE_DIR's local/site.yaml, local/study_runtime.yaml,
    local/authorization.json and local/privacy.yaml; list every problem. Files that pass are
    recorded in the kit's workspace, so the site's next start skips their check."""
    from atoll.cli.site_policy import (
        load_privacy_policy,
        load_site_policy,
        policy_lines,
        policy_report,
        privacy_line,
    )

    config, runtime, problems = _load_site(site_dir)
    policy, policy_problems = load_site_policy(site_dir)
    problems += policy_problems
    privacy, privacy_problems = load_privacy_policy(site_dir)
    problems += privacy_problems
    sandbox = None
    if not problems:
        sandbox, problems = _sandbox_problems(config)
    if problems:
        render_error(problems, fmt)
    _record(site_dir)
    studies = sorted(runtime.studies)
    report = policy_report(site_dir, policy)
    network = _network_line(config)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "launcher": config.launcher, "studies": studies,
                               **({"sandbox": sandbox} if sandbox else {}),
                               **({"network": network} if network else {}),
                               "authorization": report,
                               "privacy": privacy.model_dump() if privacy else None}))
        return
    click.echo(f"local/site.yaml: ok (launcher {config.launcher})")
    if sandbox:
        click.echo(f"{config.launcher} sandbox: {sandbox}")
    if network:
        click.echo(f"process network: {network}")
    mapped = ", ".join(studies) if studies else "none (no study gets datasets or secrets here)"
    click.echo(f"local/study_runtime.yaml: ok; studies: {mapped}")
    click.echo("\n".join(policy_lines(report)))
    click.echo(privacy_line(privacy))


@click.command("render")
@click.argument("site_dir", type=_dir)
@click.argument("job_dir", type=_dir)
@click.option("--study", required=True, help="The study the job is submitted in.")
@click.option("--job-id", default=None, help="32 hex characters (default: derived from the job).")
@click.option(
    "--site",
    "site_name",
    default=None,
    help="Render for this target (default: the site its certificate names; 'server' too).",
)
@click.option("--role", type=click.Choice(["project_admin", "org_admin", "lead", "member"]),
              default="lead", show_default=True, help="The submitter's role, for the policy.")
@click.option("--org", default=None, help="The submitter's org (default: the site's own).")
@click.option("--user", default="user@example.org", show_default=True,
              help="The submitter's name, for the policy.")
@_fmt
def render_command(
    site_dir: Path, job_dir: Path, study: str, job_id: str | None, site_name: str | None,
    role: str, org: str | None, user: str, fmt: str
) -> None:
    """Print what this site's launcher would create for the job in JOB_DIR (nothing starts),
    after local/authorization.json allowed it for a submitter of --role and --org."""
    from atoll.cli.site_policy import job_decision, load_site_policy, site_org
    from atoll.launchers.base import JobIdentity, LaunchError
    from atoll.launchers.registry import get_launcher
    from atoll.launchers.request import build_request
    from atoll.spec.authorization import Actor
    from atoll.spec.errors import SpecError
    from atoll.spec.meta import load_meta

    config, runtime, problems = _load_site(site_dir)
    meta = None
    try:
        meta = load_meta(job_dir)
    except SpecError as err:
        problems += error_problems(err, "meta.json")
    kit = _kit_identity(site_dir)
    site = site_name or (kit[0] if kit else site_dir.resolve().name)
    decision = None
    if site != "server" and not problems:  # the server runs its workflow under no site policy
        policy, policy_problems = load_site_policy(site_dir)
        problems += policy_problems
        if policy is not None:
            own_org = site_org(site_dir)
            decision, refusals = job_decision(site_dir, policy, job_dir, study,
                                              Actor(user, own_org if org is None else org, role),
                                              own_org)
            problems += refusals
    if site != "server" and runtime is not None and runtime.entry(study) is None:
        # the words the running site refuses the job with (site/supervisor.py)
        problems.append({"file": "local/study_runtime.yaml", "path": "studies",
                         "message": f"site {site} does not map study {study!r}, so it would "
                                    "refuse this job; the site operator must add it"})
    if problems:
        render_error(problems, fmt)
    job_id = job_id or hashlib.sha256(f"{job_dir.resolve()}:{study}".encode()).hexdigest()[:32]
    identity = JobIdentity(job_id, meta.name, study, site, "server" if site == "server" else "site")
    endpoint = config.worker_endpoint
    try:
        request = build_request(
            meta=meta,
            identity=identity,
            site_config=config,
            study_runtime=runtime,
            workdir=_run_folder(config, site_dir, kit, site, job_id),
            parent_address=f"{endpoint.dial_host}:{endpoint.port}",
            parent_cert=TLS_PLACEHOLDER if endpoint.uses_tls else None,
        )
        rendered = get_launcher(config.launcher, config).render(request)
    except SpecError as err:
        render_error(error_problems(err, "meta.json"), fmt)
    except (LaunchError, ValueError) as err:
        render_error(error_problems(err), fmt)
    res = request.resources
    summary = {
        "site": site,
        "launcher": config.launcher,
        "study": study,
        "job_id": job_id,
        "run_folder": str(request.workdir),
        "resources": {
            "num_of_gpus": res.num_of_gpus,
            "num_of_cpus": res.num_of_cpus,
            "memory": res.memory,
            **dict(res.extra),
        },
        "launcher_spec": dict(request.launcher_spec),
        "study_mapped": request.study_runtime is not None,
        **({"authorization": decision} if decision is not None else {}),
        "render": rendered,
    }
    if fmt == "json":
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    _print_text(summary)


def _print_text(summary: dict[str, Any]) -> None:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    res = summary["resources"]
    click.echo(
        f"site {summary['site']} (launcher {summary['launcher']}), study "
        f"{summary['study']}, job {summary['job_id']}"
    )
    click.echo(
        f"resources: {res['num_of_gpus']} GPU(s), "
        f"{str(res['num_of_cpus']) + ' CPU(s)' if res['num_of_cpus'] else 'CPUs not limited'}, "
        f"memory {res['memory'] or 'not limited'}"
    )
    if "authorization" in summary:
        auth = summary["authorization"]
        rules = ", ".join(r["rule"] for r in auth["rules"])
        approval = f"; code approved ({auth['digest']})" if auth["code_approval"] else ""
        click.echo(f"authorization: allowed for {auth['user']} ({auth['role']}, org "
                   f"{auth['org'] or '-'}) by {rules}{approval}")
    click.echo(f"run folder: {summary['run_folder']}")
    rendered = json.loads(json.dumps(summary["render"], default=str))
    click.echo(yaml.dump(rendered, Dumper=_Dumper, sort_keys=False, width=100).rstrip())
