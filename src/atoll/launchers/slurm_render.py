"""Pure: a LaunchRequest -> the ``sbatch`` argv and batch script of its worker.

``render_slurm`` returns ``{"sbatch_argv", "script", "script_path", "secrets_file",
"directives", "directive_sources", "limits"}``: the values of the directives (``--time``,
``--partition``...) and where each was configured, and the limits the launcher watches the job
against (``time``, ``mem``), as values, so nothing is read back out of the argv. Nothing here touches Slurm or holds a secret value: the job token and the
study's ``secret_env`` values are written at launch into ``secrets_file`` (mode 0600, in the run
folder), which the script sources and deletes before it starts the worker.

Resources (as NVIDIA FLARE 2.9: ``num_of_cpus`` and ``memory`` are per node, like the native
``cpus_per_node``/``mem_per_node``; ``num_of_gpus`` is the total; ``--mem`` and ``--gres`` are per
node in Slurm):

- ``--nodes=N --ntasks=N*T --ntasks-per-node=T``: T tasks (processes, ranks) per node: the job's
  ``processes_per_node`` (one per GPU of the node when it has GPUs), else 1, which gets the
  node's GPUs, CPUs and memory, as FLARE renders it (launchers/ranks.py).
- ``--cpus-per-task``: the node's CPUs shared among its T tasks (at least one each); the node's
  CPUs are ``num_of_cpus`` (per node, as in FLARE 2.9), else ``cpus_per_node``; omitted when
  neither is given.
- ``--mem=<MiB>M``: ``memory`` (per node), else ``mem_per_node`` (MiB, or 32Gi); omitted when
  neither is given (the partition's default applies).
- ``--gres=gpu:G``: ``gpus_per_node``, else ``num_of_gpus`` (single node); omitted for no GPU.
- ``--time``: the job's ``launcher_spec.time``, else the site's ``slurm.time``.

Directives: ``partition``, ``account`` and ``qos`` come from the study's ``slurm`` block in
``study_runtime.yaml`` when it sets them, else from ``site.yaml`` ``slurm``: the operator maps a
study to its own allocation. ``constraint`` and ``reservation`` are site-only. A job never sets
any of them. ``sandbox`` and ``python_path`` follow the same study-then-site rule.

Sandboxes: ``none`` runs ``<python_path> <worker_args>`` on the node; ``apptainer`` wraps it in
``apptainer exec --containall --cleanenv --no-home`` (``--nv`` with GPUs) with the run folder at
``/atoll/job`` and datasets at ``/data/<study>/<dataset>`` (ro/rw), passing variables as
``APPTAINERENV_*`` (the only ones ``--cleanenv`` lets in); ``pyxis`` adds ``--container-image``
and ``--container-mounts`` to ``srun``. Jobs of several tasks and pyxis start the worker
through ``srun`` with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (and
``ATOLL_RANK``/``ATOLL_WORLD_SIZE``) from ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``;
with more than one task the batch script also sets ``MASTER_ADDR`` (the first node's NodeAddr)
and ``MASTER_PORT`` (from the job id), and every rank but 0 loses the job's credentials before
it starts (``rank_wrapper``). A single bare or apptainer worker runs in the batch step itself
(rank 0 of 1), which also makes ``scancel`` faster.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from atoll.launchers.base import LaunchError, LaunchRequest, check_identity
from atoll.launchers.ranks import processes_per_node
from atoll.launchers.request import TOKEN_VAR
from atoll.spec import worker_env
from atoll.spec.names import is_env_name
from atoll.spec.quantity import memory_to_mib, slurm_mem_to_mib
from atoll.spec.study_runtime import data_root, dataset_mount_path

CONTAINER_WORKDIR = "/atoll/job"
SCRIPT_FILE = Path("slurm") / "worker.sbatch"
SECRETS_FILE = Path("slurm") / "secrets.env"
LOG_DIR = Path("logs")
LOG_PATTERN = "slurm-%j.out"  # %j: Slurm's job id
APPTAINER_PREFIX = "APPTAINERENV_"
APPTAINER_FLAGS = ("--containall", "--cleanenv", "--no-home")
# Directives the study's slurm block may override; the others are the site's alone.
STUDY_DIRECTIVES = ("partition", "account", "qos")
SITE_DIRECTIVES = ("constraint", "reservation")
_UNSAFE_COMMENT = re.compile(r"[^A-Za-z0-9._-]+")
# Rendezvous for torch.distributed: rank 0 runs on the allocation's first node, reached at the
# address Slurm itself uses for it (NodeAddr), on a port derived from the job id (the render
# cannot know a free one; two jobs collide only if their ids differ by a multiple of 20000).
RENDEZVOUS = [
    'master_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
    'master_addr="$(scontrol show node "$master_node" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')"',
    'export {p}MASTER_ADDR="${{master_addr:-$master_node}}" '
    '{p}MASTER_PORT="$((20000 + SLURM_JOB_ID % 20000))"',
]


def render_slurm(request: LaunchRequest) -> dict[str, Any]:
    """The worker's sbatch argv and batch script; LaunchError names what to fix."""
    check_identity(request.identity)  # its ids go into the script: never a second line
    settings = _slurm_settings(request)
    study_slurm = _study_slurm(request)
    sandbox = study_slurm.get("sandbox") or settings.sandbox
    python = study_slurm.get("python_path") or settings.python_path
    topo = topology(request)
    topo["tasks_per_node"] = processes_per_node(request, topo["gpus_per_node"])
    directives, sources = _directives(request, settings, study_slurm)
    workdir = Path(request.workdir)
    script_path = workdir / SCRIPT_FILE
    argv = [
        settings.sbatch,
        "--parsable",
        f"--job-name={job_name(request)}",
        f"--comment={job_comment(request)}",
        f"--chdir={workdir}",
        f"--output={workdir / LOG_DIR / LOG_PATTERN}",
        "--export=NONE",  # the parent's environment may hold other studies' secrets
        "--no-requeue",  # a one-time job token cannot start a worker twice
        *_task_flags(topo),
    ]
    if topo["mem_mib"] is not None:
        argv.append(f"--mem={topo['mem_mib']}M")
    if topo["gpus_per_node"]:
        argv.append(f"--gres=gpu:{topo['gpus_per_node']}")
    argv += [f"--{key}={value}" for key, value in directives.items()]
    argv.append(str(script_path))
    secrets = secret_names(request)
    script = _script(request, sandbox, python, topo, secrets, workdir)
    return {
        "sbatch_argv": argv,
        "script": script,
        "script_path": str(script_path),
        "secrets_file": {
            "path": str(workdir / SECRETS_FILE),
            "mode": "0600",
            "variables": secrets,
        },
        "directives": directives,
        "directive_sources": sources,
        "limits": {  # what the poller explains a kill with: Slurm's time limit, memory per node
            "time": directives.get("time"),
            "mem": f"{topo['mem_mib']}M" if topo["mem_mib"] is not None else None,
        },
    }


def _slurm_settings(request: LaunchRequest) -> Any:
    from atoll.spec.site_config import SlurmSettings

    settings = request.site_config.settings if request.site_config is not None else None
    if not isinstance(settings, SlurmSettings):
        launcher = getattr(request.site_config, "launcher", None)
        raise LaunchError(f"local/site.yaml chooses launcher {launcher}, not slurm")
    return settings


def _study_slurm(request: LaunchRequest) -> dict[str, Any]:
    entry = request.study_runtime
    block = entry.slurm if entry is not None else None
    return block.model_dump(exclude_none=True) if block is not None else {}


def slurm_memory(memory: str) -> str:
    """``"64Gi"`` -> ``"65536M"`` (Slurm's M is MiB)."""
    return f"{memory_to_mib(memory)}M"


def topology(request: LaunchRequest) -> dict[str, Any]:
    """Nodes and per-node CPUs, MiB and GPUs from resources and the job's slurm block.

    As NVIDIA FLARE 2.9: portable ``num_of_cpus`` and ``memory`` are per node; None when
    neither they nor ``cpus_per_node``/``mem_per_node`` are given (no directive: the
    partition's defaults apply). ``num_of_gpus`` is the total (``gpus_per_node`` per node).
    """
    spec, res = request.launcher_spec, request.resources
    nodes = spec.get("nodes") or 1
    cpus = res.num_of_cpus if res.num_of_cpus is not None else spec.get("cpus_per_node")
    if res.memory is not None:
        mem_mib = memory_to_mib(res.memory)
    elif spec.get("mem_per_node") is not None:
        mem_mib = slurm_mem_to_mib(spec["mem_per_node"])  # MiB as an integer, or 32Gi
    else:
        mem_mib = None
    gpus = spec.get("gpus_per_node")
    if gpus is None:
        if res.num_of_gpus % nodes:
            raise LaunchError(
                f"{res.num_of_gpus} GPUs do not split evenly over {nodes} nodes: set "
                "launcher_spec slurm.gpus_per_node in the job's meta.json"
            )
        gpus = res.num_of_gpus // nodes
    return {"nodes": nodes, "cpus_per_task": cpus, "mem_mib": mem_mib, "gpus_per_node": gpus}


def _task_flags(topo: dict[str, Any]) -> list[str]:
    """One task per process: ``tasks_per_node`` on each node, the node's CPUs shared out."""
    tasks, cpus = topo["tasks_per_node"], topo["cpus_per_task"]
    flags = [
        f"--nodes={topo['nodes']}",
        f"--ntasks={topo['nodes'] * tasks}",
        f"--ntasks-per-node={tasks}",
    ]
    if cpus is not None:  # none asked: the partition's default, as FLARE leaves it
        flags.append(f"--cpus-per-task={max(1, cpus // tasks)}")
    return flags


def _directives(
    request: LaunchRequest, settings: Any, study_slurm: dict[str, Any]
) -> tuple[dict[str, str], dict[str, str]]:
    """``--time`` and the site/study directives, with where each value was configured."""
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    if request.launcher_spec.get("time"):
        values["time"] = request.launcher_spec["time"]
        sources["time"] = "the job's meta.json launcher_spec slurm.time"
    elif settings.time:
        values["time"] = settings.time
        sources["time"] = "local/site.yaml slurm.time"
    study = request.identity.study
    for key in (*STUDY_DIRECTIVES, *SITE_DIRECTIVES):
        if key in study_slurm:
            values[key] = study_slurm[key]
            sources[key] = f"local/study_runtime.yaml studies.{study}.slurm.{key}"
        elif getattr(settings, key):
            values[key] = getattr(settings, key)
            sources[key] = f"local/site.yaml slurm.{key}"
    return values, sources


def job_name(request: LaunchRequest) -> str:
    """Unique per job and participant, like the other launchers' names."""
    return f"atoll-{request.identity.site}-{request.identity.job_id}"


def job_comment(request: LaunchRequest) -> str:
    """``key=value`` words naming the atoll job; the free-text job name is reduced to safe chars."""
    ident = request.identity
    name = _UNSAFE_COMMENT.sub("_", ident.job_name)[:64] or "-"
    return (
        f"atoll job_id={ident.job_id} site={ident.site} study={ident.study} "
        f"role={ident.role} name={name}"
    )


def secret_names(request: LaunchRequest) -> list[str]:
    """Variables the secrets file carries: credentials and the study's secret_env (names only)."""
    entry = request.study_runtime
    study_secrets = list(entry.secret_env) if entry is not None else []
    return sorted({TOKEN_VAR, *request.credentials, *study_secrets})


def _worker_env(request: LaunchRequest, contained: bool) -> dict[str, str]:
    entry, study = request.study_runtime, request.identity.study
    env = dict(entry.env) if entry is not None else {}
    env.update(request.worker_env)
    env.pop(worker_env.PARENT_PID, None)  # the parent is on another host
    env[worker_env.PARENT] = request.parent_address
    datasets = dict(sorted(entry.datasets.items())) if entry is not None else {}
    if contained:
        env[worker_env.WORKDIR] = CONTAINER_WORKDIR
        env[worker_env.DATA_ROOT] = data_root(study)
        env[worker_env.DATASETS] = json.dumps(
            {name: dataset_mount_path(study, name) for name in datasets}, sort_keys=True
        )
    else:
        env[worker_env.WORKDIR] = str(request.workdir)
        if datasets:
            env[worker_env.DATASETS] = json.dumps(
                {name: d.source for name, d in datasets.items()}, sort_keys=True
            )
    return dict(sorted(env.items()))


def _mounts(request: LaunchRequest) -> list[tuple[str, str, str]]:
    """(host source, path in the container, ro|rw): run folder, datasets, secret mounts."""
    entry, study = request.study_runtime, request.identity.study
    mounts = [(str(request.workdir), CONTAINER_WORKDIR, "rw")]
    if entry is not None:
        for name, dataset in sorted(entry.datasets.items()):
            mounts.append((dataset.source, dataset_mount_path(study, name), dataset.mode))
        for _name, secret in sorted(entry.secret_mounts.items()):
            mounts.append((secret.source, secret.mount_path, "ro"))
    return mounts


def _image(request: LaunchRequest) -> tuple[str, str]:
    entry, study = request.study_runtime, request.identity.study
    settings = _slurm_settings(request)
    if entry is not None and entry.container is not None:
        return entry.container.image, f"studies.{study}.container.image"
    if settings.container_image:
        return settings.container_image, "local/site.yaml slurm.container_image"
    raise LaunchError(
        f"sandbox needs an image for study {study}: set studies.{study}.container.image in "
        "local/study_runtime.yaml or slurm.container_image in local/site.yaml"
    )


def sandbox_image(request: LaunchRequest) -> str | None:
    """The image as the job's sandbox is given it (None without a container sandbox)."""
    sandbox = _study_slurm(request).get("sandbox") or _slurm_settings(request).sandbox
    convert = {"pyxis": pyxis_image, "apptainer": apptainer_image}.get(sandbox)
    return convert(_image(request)[0]) if convert else None


def apptainer_image(image: str) -> str:
    """A registry reference becomes ``docker://...``; SIF paths and URIs stay as they are."""
    if "://" in image or image.startswith(("/", "./", "../")) or image.endswith(".sif"):
        return image
    return f"docker://{image}"


def pyxis_image(image: str) -> str:
    """Docker-style ``registry.example.com/team/img:1`` -> enroot's ``registry.example.com#team/img:1``."""
    if "#" in image or "://" in image or image.startswith(("/", "./")) or image.endswith(".sqsh"):
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _script(
    request: LaunchRequest,
    sandbox: str,
    python: str,
    topo: dict[str, Any],
    secrets: list[str],
    workdir: Path,
) -> str:
    ident = request.identity
    contained = sandbox != "none"
    prefix = APPTAINER_PREFIX if sandbox == "apptainer" else ""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# atoll worker of job {_word(ident.job_id)} for {_word(ident.site)} "
        f"(study {_word(ident.study)}).",
        "# Rendered by atoll's slurm launcher; it holds no secret value.",
        "set -euo pipefail",
        "",
        "# Credentials and secret variables: a 0600 file written at submit, read once, deleted.",
        f"secrets={q(str(workdir / SECRETS_FILE))}",
        '[ -r "$secrets" ] || { echo "atoll: $secrets is missing (started twice?)" >&2; exit 1; }',
        'set -a; . "$secrets"; set +a',
        'rm -f -- "$secrets"',
    ]
    if prefix:
        lines += ["# --cleanenv lets only APPTAINERENV_* variables into the container."]
        lines += [f'export {prefix}{name}="${{{name}}}"' for name in secrets]
    lines += ["", "# The worker's environment."]
    env = _worker_env(request, contained)
    _check_env_names([*secrets, *env])  # names go unquoted before '=': each a POSIX name
    lines += [f"export {prefix}{key}={q(value)}" for key, value in env.items()]
    ranks = topo["nodes"] * topo["tasks_per_node"]
    multi = ranks > 1 or sandbox == "pyxis"
    if not multi:
        lines += [f"export {prefix}ATOLL_RANK=0 {prefix}ATOLL_WORLD_SIZE=1"]
    if ranks > 1:
        lines += ["", "# torch.distributed's rendezvous: rank 0 is on the first node."]
        lines += [line.format(p=prefix) for line in RENDEZVOUS]
    if sandbox == "none" and request.study_runtime is not None:
        for field in ("secret_mounts", "container"):  # FLARE 2.9 refuses both when bare
            if getattr(request.study_runtime, field):
                raise LaunchError(
                    f"studies.{ident.study}.{field} in local/study_runtime.yaml needs a "
                    f"container: set slurm.sandbox to apptainer or pyxis, or remove {field}"
                )
    setup = (_study_slurm(request).get("setup") or "").strip("\n")
    if setup:
        lines += ["", f"# The study's setup (local/study_runtime.yaml studies."
                  f"{_word(ident.study)}.slurm.setup).", setup]
    lines += ["", "# Start the worker."]
    segments = _launch_segments(request, sandbox, python, topo, multi, prefix, secrets)
    lines.append("exec " + " \\\n    ".join(" ".join(map(q, seg)) for seg in segments))
    return "\n".join(lines) + "\n"


def _launch_segments(
    request: LaunchRequest,
    sandbox: str,
    python: str,
    topo: dict[str, Any],
    multi: bool,
    prefix: str,
    secrets: list[str],
) -> list[list[str]]:
    """The worker's command line as groups of words, one group per line of the script."""
    segments: list[list[str]] = []
    if multi:
        segments.append(
            [
                "srun",
                *_task_flags(topo),
                "--export=ALL",  # the batch step runs with SLURM_EXPORT_ENV=NONE
                "--kill-on-bad-exit=1",
                "--label",
            ]
        )
        if sandbox == "pyxis":
            image, _source = _image(request)
            mounts = ",".join(f"{src}:{dst}:{mode}" for src, dst, mode in _mounts(request))
            segments += [
                [f"--container-image={pyxis_image(image)}"],
                [f"--container-mounts={mounts}"],
                [f"--container-workdir={CONTAINER_WORKDIR}", "--no-container-mount-home"],
            ]
        wrapper = rank_wrapper(prefix, topo["nodes"] * topo["tasks_per_node"],
                               topo["tasks_per_node"], secrets)
        segments.append(["/bin/sh", "-c", wrapper, "atoll-worker"])
    if sandbox == "apptainer":
        image, _source = _image(request)
        gpu = ["--nv"] if topo["gpus_per_node"] else []
        segments.append(["apptainer", "exec", *APPTAINER_FLAGS, *gpu, f"--pwd={CONTAINER_WORKDIR}"])
        segments += [[f"--bind={src}:{dst}:{mode}"] for src, dst, mode in _mounts(request)]
        segments.append([apptainer_image(image)])
    segments.append([python, *request.worker_args])
    return segments


def rank_wrapper(prefix: str, ranks: int, tasks_per_node: int, secrets: list[str]) -> str:
    """What each srun task runs before the worker: its rank variables (PyTorch's names and
    atoll's), and, on every rank but 0, the job's credentials removed: they reach every node in
    the step's environment, but only rank 0 registers with the parent."""
    p = prefix
    if ranks == 1:  # pyxis's one task: rank 0 of 1, nothing to withhold
        return f'export {p}ATOLL_RANK="$SLURM_PROCID" {p}ATOLL_WORLD_SIZE="$SLURM_NTASKS"; exec "$@"'
    withheld = " ".join(sorted({*secrets, *(f"{p}{name}" for name in secrets)}))
    return (
        f'export {p}RANK="$SLURM_PROCID" {p}WORLD_SIZE="$SLURM_NTASKS" '
        f'{p}LOCAL_RANK="$SLURM_LOCALID" {p}LOCAL_WORLD_SIZE={tasks_per_node} '
        f'{p}ATOLL_RANK="$SLURM_PROCID" {p}ATOLL_WORLD_SIZE="$SLURM_NTASKS"; '
        f'[ "$SLURM_PROCID" = 0 ] || unset {withheld}; exec "$@"'
    )


def _word(text: str) -> str:
    """A value as it may appear in a comment line of the script: one word of safe characters
    (a newline in a comment would start a command)."""
    return _UNSAFE_COMMENT.sub("_", text) or "-"


def _check_env_names(names: list[str]) -> None:
    bad = sorted(repr(name)[:80] for name in names if not is_env_name(name))
    if bad:
        raise LaunchError(f"not environment variable names: {', '.join(bad)}; use letters, "
                          "digits and '_', not starting with a digit")


def secrets_file_text(values: dict[str, str]) -> str:
    """The secrets file's content (at launch only): one quoted assignment per variable."""
    bad = sorted(name for name in values if not is_env_name(name))
    if bad:
        raise LaunchError(f"not environment variable names: {', '.join(bad)}")
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(values.items()))
