"""``atoll job init DIR``: write a job folder that runs as is, to start a new job from.

The folder holds ``meta.json`` (deploy map, min_clients, resources), ``app/app.yaml`` (the
workflow and its arguments, the site script) and ``app/train.py`` (a numpy or PyTorch training
loop on synthetic data, with the places to change marked). Templates live in
``atoll/fl/templates``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from string import Template

import click

from atoll.cli.common import fail

WORKFLOWS = ("fedavg", "fedopt", "fedprox", "scatter_gather")
FRAMEWORKS = ("numpy", "torch")

_SERVER_ARGS = {
    "fedavg": {"num_rounds": 5, "key_metric": "accuracy", "cross_site_eval": "global"},
    "fedprox": {"num_rounds": 5, "key_metric": "accuracy", "mu": 0.01},
    "fedopt": {"num_rounds": 5, "key_metric": "accuracy", "optimizer": "adam", "server_lr": 0.1},
    "scatter_gather": {"num_rounds": 1, "payload_bytes": 1024},
}


def _template(name: str) -> str:
    return resources.files("atoll.fl").joinpath("templates", name).read_text(encoding="utf-8")


def render_job(name: str, workflow: str, sites: list[str], framework: str) -> dict[str, str]:
    """The files of a new job folder, relative path -> content."""
    if workflow not in WORKFLOWS:
        raise ValueError(f"workflow must be one of {', '.join(WORKFLOWS)}, got {workflow!r}")
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    targets = ["server", *sites] if sites else ["@ALL"]
    min_clients = len(sites) if sites else 2
    meta = {
        "name": name,
        "deploy_map": {"app": targets},
        "min_clients": min_clients,
        "resource_spec": {"@default": {"num_of_cpus": 1, "memory": "2Gi"}},
    }
    args = {**_SERVER_ARGS[workflow]}
    if workflow != "scatter_gather":
        args["round_timeout"] = 600
    server_args = "\n".join(f"    {key}: {json.dumps(value)}" for key, value in args.items())
    app_yaml = Template(_template("app.yaml.tmpl")).substitute(
        workflow=workflow, server_args=server_args
    )
    script = "echo.py.tmpl" if workflow == "scatter_gather" else f"train_{framework}.py.tmpl"
    return {
        "meta.json": json.dumps(meta, indent=2) + "\n",
        "app/app.yaml": app_yaml,
        "app/train.py": _template(script),
    }


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--workflow",
    type=click.Choice(WORKFLOWS),
    default="fedavg",
    show_default=True,
    help="The server workflow the job runs.",
)
@click.option(
    "--sites",
    "sites",
    multiple=True,
    metavar="SITE",
    help="Target these sites (repeat or comma-separate); default: every site (@ALL).",
)
@click.option(
    "--framework",
    type=click.Choice(FRAMEWORKS),
    default="numpy",
    show_default=True,
    help="The training loop written to app/train.py.",
)
@click.option("--name", default=None, help="The job's name; default: the folder's name.")
@click.option("--force", is_flag=True, help="Write into a folder that is not empty.")
def init_command(
    directory: Path,
    workflow: str,
    sites: tuple[str, ...],
    framework: str,
    name: str | None,
    force: bool,
) -> None:
    """Write a working template job folder in DIRECTORY."""
    site_list = [s.strip() for entry in sites for s in entry.split(",") if s.strip()]
    bad = [s for s in site_list if s in ("server", "@ALL") or "/" in s]
    if bad:
        raise click.BadParameter(f"not a site name: {', '.join(bad)}", param_hint="--sites")
    if directory.exists() and any(directory.iterdir()) and not force:
        fail(f"{directory} is not empty; choose a new folder or pass --force")
    files = render_job(name or directory.resolve().name, workflow, site_list, framework)
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    click.echo(f"wrote {directory}/: " + ", ".join(files))
    click.echo(f"try it locally:  atoll job simulate {directory}")
    click.echo(f"submit it:       atoll job submit {directory} --kit ADMIN_KIT")
