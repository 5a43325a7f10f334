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
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

EXIT_INVALID = 2
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

def _problems_exit(problems: list[dict[str, str]], fmt: str) -> NoReturn:
    if fmt == "json":
        click.echo(json.dumps({"ok": False, "errors": problems}, indent=2))
    else:
        click.secho(f"{len(problems)} problem(s):", fg="red", err=True)
        for p in problems:
            where = ": ".join(x for x in (p["file"], p["path"]) if x)
            click.echo(f"  {where}: {p['message']}", err=True)
    sys.exit(EXIT_INVALID)


def _as_problems(err: Exception, file: str) -> list[dict[str, str]]:
    from atoll.spec.errors import SpecError

    if isinstance(err, SpecError):
        return [
            {"file": err.source or file, "path": i.path, "message": i.message} for i in err.issues
        ]
    return [{"file": file, "path": "", "message": str(err)}]


def _load_site(site_dir: Path) -> tuple[Any, Any, list[dict[str, str]]]:
    """site.yaml then study_runtime.yaml (checked for the site's launcher), all problems."""
    from atoll.spec.errors import SpecError
    from atoll.spec.site_config import load_site_config, read_yaml
    from atoll.spec.study_runtime import load_study_runtime

    local = site_dir / "local"
    problems: list[dict[str, str]] = []
    config = runtime = None
    launcher = None
    try:
        config = load_site_config(local / "site.yaml")
        launcher = config.launcher
    except SpecError as err:
        problems += _as_problems(err, "local/site.yaml")
        raw = _quiet(lambda: read_yaml(local / "site.yaml"))
        guess = raw.get("launcher") if isinstance(raw, dict) else None
        launcher = guess if guess in ("process", "docker", "k8s", "slurm") else None
    try:
        runtime = load_study_runtime(local, launcher)
    except SpecError as err:
        problems += _as_problems(err, "local/study_runtime.yaml")
    return config, runtime, problems


def _quiet(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


@click.command("validate")
@click.argument("site_dir", type=_dir)
@_fmt
def validate_command(site_dir: Path, fmt: str) -> None:
    """Check SITE_DIR's local/site.yaml and local/study_runtime.yaml; list every problem."""
    config, runtime, problems = _load_site(site_dir)
    if problems:
        _problems_exit(problems, fmt)
    studies = sorted(runtime.studies)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "launcher": config.launcher, "studies": studies}))
        return
    click.echo(f"local/site.yaml: ok (launcher {config.launcher})")
    mapped = ", ".join(studies) if studies else "none (no study gets datasets or secrets here)"
    click.echo(f"local/study_runtime.yaml: ok; studies: {mapped}")


@click.command("render")
@click.argument("site_dir", type=_dir)
@click.argument("job_dir", type=_dir)
@click.option("--study", required=True, help="The study the job is submitted in.")
@click.option("--job-id", default=None, help="32 hex characters (default: derived from the job).")
@click.option(
    "--site",
    "site_name",
    default=None,
    help="Render for this target (default: SITE_DIR's folder name; 'server' too).",
)
@_fmt
def render_command(
    site_dir: Path, job_dir: Path, study: str, job_id: str | None, site_name: str | None, fmt: str
) -> None:
    """Print what this site's launcher would create for the job in JOB_DIR (nothing starts)."""
    from atoll.launchers.base import JobIdentity, LaunchError
    from atoll.launchers.registry import get_launcher
    from atoll.launchers.request import build_request, job_run_folder
    from atoll.spec.errors import SpecError
    from atoll.spec.meta import load_meta

    config, runtime, problems = _load_site(site_dir)
    meta = None
    try:
        meta = load_meta(job_dir)
    except SpecError as err:
        problems += _as_problems(err, "meta.json")
    if problems:
        _problems_exit(problems, fmt)
    site = site_name or site_dir.resolve().name
    job_id = job_id or hashlib.sha256(f"{job_dir.resolve()}:{study}".encode()).hexdigest()[:32]
    identity = JobIdentity(job_id, meta.name, study, site, "server" if site == "server" else "site")
    endpoint = config.worker_endpoint
    try:
        request = build_request(
            meta=meta,
            identity=identity,
            site_config=config,
            study_runtime=runtime,
            workdir=job_run_folder(config, job_id),
            parent_address=f"{endpoint.dial_host}:{endpoint.port}",
            parent_cert=TLS_PLACEHOLDER if endpoint.uses_tls else None,
        )
        rendered = get_launcher(config.launcher, config).render(request)
    except SpecError as err:
        _problems_exit(_as_problems(err, "meta.json"), fmt)
    except (LaunchError, ValueError) as err:
        _problems_exit([{"file": "", "path": "", "message": str(err)}], fmt)
    res = request.resources
    summary = {
        "site": site,
        "launcher": config.launcher,
        "study": study,
        "job_id": job_id,
        "resources": {
            "num_of_gpus": res.num_of_gpus,
            "num_of_cpus": res.num_of_cpus,
            "memory": res.memory,
            **dict(res.extra),
        },
        "launcher_spec": dict(request.launcher_spec),
        "study_mapped": request.study_runtime is not None,
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
        f"resources: {res['num_of_gpus']} GPU(s), {res['num_of_cpus']} CPU(s), "
        f"memory {res['memory'] or 'not limited'}"
    )
    if not summary["study_mapped"]:
        click.echo(f"note: local/study_runtime.yaml maps nothing for study {summary['study']}")
    rendered = json.loads(json.dumps(summary["render"], default=str))
    click.echo(yaml.dump(rendered, Dumper=_Dumper, sort_keys=False, width=100).rstrip())
