"""``atoll job init DIR``: write a job folder that runs as is, to start a new job from.

The folder holds ``meta.json`` (deploy map, min_clients, resources), ``app/app.yaml`` (the
workflow and its arguments, the site script) and ``app/train.py`` (a numpy or PyTorch training
loop on synthetic data, with the places to change marked; ``torch-ddp``: several
processes per site with DistributedDataParallel, docs/distributed.md; ``lightning``: a Lightning
Trainer federated by ``atoll.fl.lightning_callback``, also on several processes per site;
``hf``: a Transformers Trainer federated by ``atoll.fl.hf_trainer``, ``hf-lora`` the same with a
PEFT LoRA model that exchanges its adapters only; models built from a config, nothing
downloaded); a workflow the job ships (scaffold, cyclic, stats, custom) adds its class and
helpers to ``app/``. Templates live in ``atoll/fl/templates``.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from string import Template

import click

from atoll.cli.common import emit, fail, format_option, printable

WORKFLOWS = ("fedavg", "fedopt", "fedprox", "scatter_gather", "scaffold", "cyclic", "stats",
             "custom")
# Workflows written on the public API and shipped in the job: app.yaml's name for the class,
# then the app's files (its workflow, the site script, helpers) -> their templates. The
# scaffold, cyclic and stats workflows are the examples' own (examples/), kept equal by a test.
JOB_WORKFLOWS: dict[str, tuple[str, dict[str, str]]] = {
    "custom": ("my_workflow.py:MyFedAvg", {"my_workflow.py": "my_workflow.py.tmpl"}),
    "scaffold": ("scaffold_workflow.py:Scaffold", {
        "scaffold_workflow.py": "scaffold_workflow.py.tmpl", "scaffold.py": "scaffold.py.tmpl",
        "train.py": "train_scaffold.py.tmpl"}),
    "cyclic": ("cyclic_workflow.py:Cyclic", {
        "cyclic_workflow.py": "cyclic_workflow.py.tmpl", "model.py": "cyclic_model.py.tmpl",
        "train.py": "train_cyclic.py.tmpl"}),
    "stats": ("statistics_workflow.py:FederatedStatistics", {
        "statistics_workflow.py": "statistics_workflow.py.tmpl",
        "train.py": "site_statistics.py.tmpl"}),
}
FRAMEWORKS = ("numpy", "torch", "torch-ddp", "lightning", "hf", "hf-lora")
# torch-ddp, lightning: several processes per site (DDP); two on CPUs, so the templates run
# anywhere. The others are not written for ranks and run one process whatever the GPUs.
_RANKED = ("torch-ddp", "lightning")
_DDP_LAUNCHER_SPEC = {"default": {backend: {"processes_per_node": 2}
                                  for backend in ("process", "docker", "k8s", "slurm")}}

_SERVER_ARGS = {
    "fedavg": {"num_rounds": 5, "key_metric": "accuracy", "cross_site_eval": "global"},
    "fedprox": {"num_rounds": 5, "key_metric": "accuracy", "mu": 0.01},
    "fedopt": {"num_rounds": 5, "key_metric": "accuracy", "optimizer": "adam", "server_lr": 0.1},
    "scatter_gather": {"num_rounds": 1, "payload_bytes": 1024},
    "custom": {"num_rounds": 5, "robust": False, "patience": 2},
    "scaffold": {"num_rounds": 5, "server_lr": 1.0},
    "cyclic": {"num_cycles": 3},
    "stats": {"columns": ["age", "bmi"], "quantiles": [0.25, 0.5, 0.75]},
}


FEDPROX_MARK = "  # fedprox"  # a template line only the fedprox job keeps
LORA_MARK = "  # lora"  # a template line only the hf-lora job keeps


def _template(name: str) -> str:
    return resources.files("atoll.fl").joinpath("templates", name).read_text(encoding="utf-8")


def _site_script(name: str, workflow: str, framework: str = "") -> str:
    """A training template for ``workflow``: FedProx keeps the lines that apply the proximal
    term (marked ``# fedprox``), every other workflow drops them; likewise ``hf-lora`` keeps
    the lines that make a LoRA model (``# lora``)."""
    keep = {FEDPROX_MARK: workflow == "fedprox", LORA_MARK: framework == "hf-lora"}
    lines = []
    for line in _template(name).splitlines(keepends=True):
        mark = next((m for m in keep if m in line), None)
        if mark is None:
            lines.append(line)
        elif keep[mark]:
            code, _, rest = line.partition(mark)
            lines.append(code + (f"  #{rest[1:]}" if rest.strip(": \n") else "\n"))
    return "".join(lines)


def render_job(name: str, workflow: str, sites: list[str], framework: str,
               min_clients: int | None = None) -> dict[str, str]:
    """The files of a new job folder, relative path -> content. ``min_clients``: how many of
    the sites must take part; default: every site named, or (for @ALL) not written, which
    means every site the job reaches."""
    if workflow not in WORKFLOWS:
        raise ValueError(f"workflow must be one of {', '.join(WORKFLOWS)}, got {workflow!r}")
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    targets = ["server", *sites] if sites else ["@ALL"]
    if sites and min_clients is None:
        min_clients = len(sites)
    meta: dict = {"name": name, "deploy_map": {"app": targets}}
    if min_clients is not None:
        meta["min_clients"] = min_clients
    meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "2Gi"}}
    if framework in _RANKED:
        meta["resource_spec"] = {"@default": {"num_of_cpus": 2, "memory": "4Gi"}}
        meta["launcher_spec"] = _DDP_LAUNCHER_SPEC
    args = {**_SERVER_ARGS[workflow]}
    if framework in ("hf", "hf-lora") and "key_metric" in args:
        args.update(key_metric="eval_loss", key_metric_mode="min")  # what Trainer.evaluate() gives
    if workflow != "scatter_gather":
        args["round_timeout"] = 600
    server_args = "\n".join(f"    {key}: {json.dumps(value)}" for key, value in args.items())
    shipped, app_files = JOB_WORKFLOWS.get(workflow, (workflow, {}))
    app_yaml = Template(_template("app.yaml.tmpl")).substitute(
        workflow=shipped, server_args=server_args
    )
    template = "hf" if framework == "hf-lora" else framework.replace("-", "_")
    script = "echo.py.tmpl" if workflow == "scatter_gather" else f"train_{template}.py.tmpl"
    files = {
        "meta.json": json.dumps(meta, indent=2) + "\n",
        "app/app.yaml": app_yaml,
        "app/train.py": _site_script(script, workflow, framework),
    }
    files.update({f"app/{name}": _template(source) for name, source in app_files.items()})
    return files


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--workflow",
    type=click.Choice(WORKFLOWS),
    default="fedavg",
    show_default=True,
    help="The server workflow the job runs: a built-in, or one shipped in the job (scaffold, "
    "cyclic, stats: federated statistics, custom: a workflow class to change).",
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
    help="The training loop written to app/train.py: numpy, torch, torch-ddp (several "
    "processes per site), lightning (a Lightning Trainer, several processes per site), "
    "hf (a Transformers Trainer), hf-lora (the same, exchanging LoRA adapters only).",
)
@click.option("--name", default=None, help="The job's name; default: the folder's name.")
@click.option("--force", is_flag=True, help="Write into a folder that is not empty.")
@format_option
def init_command(
    directory: Path,
    workflow: str,
    sites: tuple[str, ...],
    framework: str,
    name: str | None,
    force: bool,
    fmt: str,
) -> None:
    """Write a working template job folder in DIRECTORY.

    min_clients (meta.json) is the number of sites it targets: those of --sites, else the
    sites of the study you are logged in to; without either it is left out, so every site
    the job reaches must take part."""
    site_list = [s.strip() for entry in sites for s in entry.split(",") if s.strip()]
    bad = [s for s in site_list if s in ("server", "@ALL") or "/" in s]
    if bad:
        raise click.BadParameter(f"not a site name: {', '.join(bad)}", param_hint="--sites")
    if directory.exists() and any(directory.iterdir()) and not force:
        fail(f"{directory} is not empty; choose a new folder or pass --force")
    min_clients, why = (len(site_list), "the sites of --sites") if site_list else _study_sites()
    files = render_job(name or directory.resolve().name, workflow, site_list, framework,
                       min_clients)
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    logged_in = _logged_in()
    submit = f"atoll job submit {directory}" + ("" if logged_in else " --kit ADMIN_KIT")
    emit({"directory": str(directory), "files": list(files), "workflow": workflow,
          "framework": framework, "min_clients": min_clients, "min_clients_from": why,
          "submit": submit}, fmt, "\n".join([
              f"wrote {printable(directory)}/: " + ", ".join(files),
              f"min_clients: {min_clients} ({why})" if min_clients is not None
              else f"min_clients: not set ({why}): every site the job reaches must take part",
              f"try it locally:  atoll job simulate {printable(directory)}",
              f"submit it:       {printable(submit)}"
              + ("" if logged_in else "   (or `atoll login --kit ADMIN_KIT` first)")]))


def _logged_in() -> bool:
    from atoll.cli.common import saved_session

    return bool(saved_session().get("token")) or bool(os.environ.get("ATOLL_KIT"))


def _study_sites() -> tuple[int | None, str]:
    """How many sites the logged-in study has, and a word on where that number came from."""
    from atoll.cli.common import open_session, saved_session
    from atoll.spec.errors import AtollError

    if not _logged_in():
        return None, "not logged in, so the study's sites are unknown; pass --sites to set it"
    try:
        with open_session(None) as session:
            answer = session.sites()
    except (AtollError, OSError) as exc:
        return None, f"the study's sites could not be listed: {exc}"
    count = len(answer.get("sites", []))
    if count == 0:
        return None, f"study {answer.get('study')} has no sites yet"
    study = answer.get("study") or saved_session().get("study")
    return count, f"the {count} site{'s' if count != 1 else ''} of study {study}"
