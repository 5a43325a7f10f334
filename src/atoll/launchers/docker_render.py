"""Pure: a LaunchRequest -> the Docker SDK ``containers.run`` keyword arguments of its worker.

``render_docker`` returns ``{"containers.run": kwargs, "secret_env": refs, "image_source": s}``.
``kwargs`` are exactly what the launcher passes to the engine, minus the secret variables: those
(the job token, the study's ``secret_env``) are listed in ``secret_env`` as references and their
values are added to ``environment`` only at launch, from the request's credentials (where the
site parent put them).

Precedence of the keyword arguments, lowest first: site.yaml ``docker.run_kwargs``, the study's
``docker_kwargs``, the job's ``launcher_spec`` (``shm_size``), then the launcher-owned keys
(image, command, environment, mounts, resources, labels, name, network, working_dir), which
nothing else may set (the spec layer refuses them; this module checks again).

Rules worth knowing:
- Mounts: the job's run folder at ``/atoll/job`` (rw), datasets at ``/data/<study>/<dataset>``
  (ro or rw), secret mounts read-only. A bind of the engine's socket, or of a folder holding it,
  is refused: a job must never control the engine that runs it. So is a bind that is, holds or
  lies inside the site kit or the folder of every job's run folder (keys, settings, other jobs).
- Confinement: ``privileged: false``, ``cap_drop: [ALL]`` and ``no-new-privileges`` always (the
  spec layer refuses what would loosen them); the engine's default seccomp and AppArmor profiles
  stay; ``NVIDIA_VISIBLE_DEVICES=void`` when the job asks no GPU (images often say ``all``).
- Network (``network_plan``): by default (``docker.network`` unset or ``none``) the container has
  no network at all (``network_mode: none``: its own loopback only, no route to other jobs, the
  host's listeners or the engine's abstract sockets) and reaches its parent through a per-job
  unix socket the launcher relays to the parent's own unix socket (or, where it has none, its
  plain TCP endpoint; launchers/socket_relay.py), in the run folder: ``/atoll/job/
  .atoll-parent.sock``. A named network: the container joins it (the site's choice: every job
  on it can reach the others), dialling a routable parent directly and a loopback parent through
  the socket. ``host``: the host's network, the site's explicit opt-out.
- User: ``user`` from run_kwargs/docker_kwargs if set; otherwise the parent's own uid:gid (the
  run folder is the parent's), or ``1000:1000`` when the parent is root (the launcher then hands
  the run folder to that user). Datasets mounted rw must be writable by that user.
- GPUs: one ``device_requests`` entry with the ``device_ids`` the launcher reserved for this job
  (``docker.gpu_ids``, default 0..capacity.gpus-1; never a ``count``, which always means the
  engine's first N GPUs); 0 renders an empty list.
- Several processes (``processes_per_node`` > 1; N GPUs alone are one process that sees them): all in this one container, started
  by the worker as rank 0 (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``; launchers/
  ranks.py). One job never spans several containers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from atoll.launchers.base import LaunchError, LaunchRequest, check_ids
from atoll.launchers.images import choose_image
from atoll.launchers.lent_folders import refuse_parent_folders
from atoll.launchers.ranks import container_rank_env
from atoll.launchers.socket_relay import SOCKET_NAME as RELAY_SOCKET_NAME
from atoll.spec import worker_env
from atoll.spec.docker_kwargs import docker_kwargs_issues
from atoll.spec.names import address_host, is_loopback
from atoll.spec.quantity import docker_size_to_bytes, memory_to_bytes
from atoll.spec.study_runtime import data_root, dataset_mount_path

CONTAINER_WORKDIR = "/atoll/job"
WORKER_PYTHON = "python3"
ROOT_PARENT_JOB_USER = "1000:1000"
NANO = 1_000_000_000
# Where engines usually listen; the site's own base_url socket is added to these.
ENGINE_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock")
CREDENTIAL_NOTE = "credential of this job, set at launch"
NO_GPU = "void"  # NVIDIA_VISIBLE_DEVICES: no GPU, whatever the image's own environment says
# In the container: the job's relay socket to its parent, in the run folder.
PARENT_SOCKET = f"{CONTAINER_WORKDIR}/{RELAY_SOCKET_NAME}"


def render_docker(
    request: LaunchRequest,
    *,
    parent_ids: tuple[int, int] = (0, 0),
    engine_socket: str | None = None,
    gpu_ids: list[str] | None = None,
) -> dict[str, Any]:
    """The worker container of ``request``; ``parent_ids`` is the parent's (uid, gid).

    ``gpu_ids``: the GPUs reserved for this job (the launcher's); None: the first ids of the
    site's list, as a preview.
    """
    settings = request.site_config.settings
    identity, entry = request.identity, request.study_runtime
    choice = choose_image(
        launcher="docker",
        study=identity.study,
        job_image=request.launcher_spec.get("image"),
        study_runtime=entry,
        default_image=settings.default_image,
        allowed_job_images=settings.allow_job_images,
    )
    kwargs: dict[str, Any] = {"init": True}  # tini as PID 1: the worker gets SIGTERM on stop
    _merge_free_kwargs(kwargs, settings.run_kwargs, "local/site.yaml", "docker.run_kwargs")
    if entry is not None:
        _merge_free_kwargs(
            kwargs,
            entry.docker_kwargs,
            "local/study_runtime.yaml",
            f"studies.{identity.study}.docker_kwargs",
        )
    if request.launcher_spec.get("shm_size") is not None:  # "8g", 2Gi or bytes: bytes here
        kwargs["shm_size"] = docker_size_to_bytes(request.launcher_spec["shm_size"])
    kwargs.setdefault("user", _default_user(parent_ids))

    resources = request.resources
    plan = network_plan(settings.network, request.parent_address)
    mounts = _mounts(request, engine_socket)
    environment = _environment(request)
    if plan.relay:  # the job's relay socket, in its run folder (launchers/socket_relay.py)
        environment[worker_env.PARENT] = f"unix:{PARENT_SOCKET}"
        environment.pop(worker_env.PARENT_CERT, None)  # no TLS on a unix socket
    if gpu_ids is None:
        gpu_ids = site_gpu_ids(request.site_config)[: resources.num_of_gpus]
    if len(gpu_ids) != resources.num_of_gpus:
        raise LaunchError(gpu_shortage(request.site_config, resources.num_of_gpus))
    kwargs.update(
        image=choice.image,
        command=[WORKER_PYTHON, *request.worker_args],
        name=container_name(identity.site, identity.job_id),
        labels={**settings.labels, **worker_labels(request)},
        environment=dict(sorted(environment.items())),
        working_dir=CONTAINER_WORKDIR,
        mounts=mounts,
        device_requests=_gpu_requests(list(gpu_ids)),
        detach=True,
        # Over anything run_kwargs/docker_kwargs say (the spec layer refuses what would loosen).
        privileged=False,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
    )
    if resources.num_of_cpus is not None:  # none asked: no CPU limit, as in NVIDIA FLARE
        kwargs["nano_cpus"] = resources.num_of_cpus * NANO
    if resources.memory is not None:
        kwargs["mem_limit"] = memory_to_bytes(resources.memory)
        kwargs["memswap_limit"] = kwargs["mem_limit"]  # no swap beyond the job's memory
    kwargs.update(plan.kwargs)
    return {
        "containers.run": dict(sorted(kwargs.items())),
        "secret_env": _secret_references(request),
        "image_source": choice.source,
    }


def container_name(site: str, job_id: str) -> str:
    """Unique per job and participant, of checked ids only (spec/names.py: [A-Za-z0-9._-])."""
    check_ids(job_id, site)
    return f"atoll-{site}-{job_id}"


def worker_labels(request: LaunchRequest) -> dict[str, str]:
    identity = request.identity
    return {
        "atoll.job_id": identity.job_id,
        "atoll.job_name": identity.job_name,
        "atoll.role": identity.role,
        "atoll.site": identity.site,
        "atoll.study": identity.study,
    }


def _merge_free_kwargs(kwargs: dict[str, Any], extra: dict[str, Any], file: str, at: str) -> None:
    issues = docker_kwargs_issues(extra)
    if issues:
        raise LaunchError(f"{file}: " + "; ".join(f"{at}.{i.path}: {i.message}" for i in issues))
    kwargs.update(extra)


def _default_user(parent_ids: tuple[int, int]) -> str:
    uid, gid = parent_ids
    return ROOT_PARENT_JOB_USER if uid == 0 else f"{uid}:{gid}"


def _environment(request: LaunchRequest) -> dict[str, str]:
    entry, study = request.study_runtime, request.identity.study
    env = dict(entry.env) if entry is not None else {}
    env.update(request.worker_env)
    env.pop(worker_env.PARENT_PID, None)  # another PID namespace: meaningless in a container
    env.update(ATOLL_WORKDIR=CONTAINER_WORKDIR, ATOLL_DATA_ROOT=data_root(study))
    # The same {name: path} map the process launcher passes, with the paths inside the container.
    datasets = {name: dataset_mount_path(study, name) for name in (entry.datasets if entry else {})}
    env[worker_env.DATASETS] = json.dumps(datasets, sort_keys=True)
    env[worker_env.PARENT] = request.parent_address
    if not request.resources.num_of_gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = NO_GPU
    env.update(container_rank_env(request))  # several ranks: all in this one container
    return dict(sorted(env.items()))


def _secret_references(request: LaunchRequest) -> dict[str, str]:
    """Names of the variables added at launch, with where each value comes from."""
    refs = {name: CREDENTIAL_NOTE for name in request.credentials}
    entry = request.study_runtime
    if entry is not None:
        for name, ref in entry.secret_env.items():
            refs[name] = f"${ref.key} of the site parent's environment"
    return dict(sorted(refs.items()))


def _bind(source: str, target: str, read_only: bool) -> dict[str, Any]:
    return {"Type": "bind", "Source": source, "Target": target, "ReadOnly": read_only}


def _mounts(request: LaunchRequest, engine_socket: str | None) -> list[dict[str, Any]]:
    study, entry = request.identity.study, request.study_runtime
    binds = [_bind(str(request.workdir), CONTAINER_WORKDIR, False)]
    where = {str(request.workdir): "the job's run folder"}
    if entry is not None:
        for name, dataset in entry.datasets.items():
            binds.append(
                _bind(dataset.source, dataset_mount_path(study, name), dataset.mode == "ro")
            )
            where[dataset.source] = f"studies.{study}.datasets.{name}.source"
        for name, secret in entry.secret_mounts.items():
            binds.append(_bind(secret.source, secret.mount_path, True))
            where[secret.source] = f"studies.{study}.secret_mounts.{name}.source"
    sockets = {*ENGINE_SOCKETS, *([engine_socket] if engine_socket else [])}
    for bind in binds[1:]:  # the run folder itself is the launcher's
        source = PurePosixPath(bind["Source"])
        for sock in sockets:
            if source == PurePosixPath(sock) or source in PurePosixPath(sock).parents:
                raise LaunchError(
                    f"local/study_runtime.yaml: {where[bind['Source']]} ({source}) would put "
                    f"the Docker engine's socket {sock} inside a job container, which would let "
                    "the job control this host; point it at the data folder itself"
                )
        refuse_parent_folders(source, request, where[bind["Source"]])
    return binds


def site_gpu_ids(site_config: Any) -> list[str]:
    """The GPU ids this site hands out: docker.gpu_ids, else 0..capacity.gpus-1."""
    listed = site_config.settings.gpu_ids
    if listed:
        return list(listed)
    return [str(i) for i in range(site_config.capacity.gpus or 0)]


def gpu_shortage(site_config: Any, asked: int) -> str:
    ids = site_gpu_ids(site_config)
    if not ids:
        return (f"the job asks for {asked} GPU(s); this site lists none: name the host's GPU ids "
                "in docker.gpu_ids (or set capacity.gpus) in local/site.yaml")
    return (f"the job asks for {asked} GPU(s); this site lists {len(ids)} (docker.gpu_ids, else "
            f"capacity.gpus, in local/site.yaml: {', '.join(ids)})")


def _gpu_requests(ids: list[str]) -> list[dict[str, Any]]:
    if not ids:
        return []  # explicit: no GPU, whatever a default asked for
    # The SDK's docker.types.DeviceRequest fields (`docker run --gpus '"device=1,3"'`): these
    # GPUs exactly; a count would always mean the engine's first N, whatever others hold.
    return [{"driver": "", "count": 0, "device_ids": ids, "capabilities": [["gpu"]]}]


@dataclass(frozen=True)
class NetworkPlan:
    kwargs: dict[str, str]  # network_mode or network for containers.run
    relay: bool  # the worker dials its parent through the job's relay socket


def network_plan(network: str | None, parent_address: str) -> NetworkPlan:
    """How a worker container is networked and reaches its parent (see the module notes)."""
    if network == "host":
        return NetworkPlan({"network_mode": "host"}, relay=False)
    if network in (None, "none"):
        return NetworkPlan({"network_mode": "none"}, relay=True)
    return NetworkPlan({"network": network}, relay=is_loopback(address_host(parent_address)))
