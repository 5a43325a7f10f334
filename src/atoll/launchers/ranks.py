"""How many processes a site's worker runs per node, and their rendezvous (PyTorch's names).

A job trains with several processes only when it asks for them: ``launcher_spec``
``processes_per_node`` (N > 1; with GPUs, one per GPU of the node, each rank seeing its own, as
``torchrun --nproc-per-node`` does). A job that asks N GPUs and no ranks gets one process that
sees all N, as in FLARE: a script not written for several ranks never runs N times. Only a
site's worker ever runs several: the server's workflow is one process. Rank 0 alone gets the job's credentials (docs/distributed.md).

- Process, Docker, Kubernetes: one worker starts on one host, container or pod with
  ``WORLD_SIZE = LOCAL_WORLD_SIZE = N`` and ``MASTER_ADDR=127.0.0.1``, without ``RANK``; it
  becomes rank 0, picks ``MASTER_PORT`` and starts the other N-1 (worker/local_ranks.py).
  Several pods or containers for one job are out of scope.
- Slurm: ``srun`` starts every rank; the batch script sets the rendezvous (slurm_render.py).
"""

from __future__ import annotations

from atoll.launchers.base import LaunchError, LaunchRequest
from atoll.launchers.rank_names import MAX_RANK_ERROR_BYTES, RANK_ERROR_FILE, WITHHELD_ENV
from atoll.launchers.request import TOKEN_VAR

__all__ = ["MAX_RANK_ERROR_BYTES", "RANK_ERROR_FILE", "WITHHELD_ENV"]  # shared: rank_names.py

LOCAL_MASTER = "127.0.0.1"


def processes_per_node(request: LaunchRequest, gpus_per_node: int) -> int:
    """The ranks on each node: those the job asks (``processes_per_node``), else one (which
    sees every GPU of the node); LaunchError when several cannot each get one GPU."""
    if request.identity.role != "site":
        return 1
    asked = request.launcher_spec.get("processes_per_node")
    if asked and gpus_per_node and asked not in (1, gpus_per_node):
        raise LaunchError(
            f"launcher_spec processes_per_node is {asked} but the job asks {gpus_per_node} GPU(s) "
            "per node: each process gets one GPU (or one process gets them all), so set it to "
            f"{gpus_per_node} or 1 in the job's meta.json"
        )
    return asked or 1


def single_node_rendezvous(processes: int) -> dict[str, str]:
    """What a one-node backend renders for ``processes`` ranks (nothing for one process)."""
    if processes <= 1:
        return {}
    return {"WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes),
            "MASTER_ADDR": LOCAL_MASTER}


def container_rank_env(request: LaunchRequest) -> dict[str, str]:
    """The rendezvous of one container or pod running the job's ranks; with one GPU per rank,
    the GPUs the runtime shows the container (numbered 0..N-1 there) dealt out by index."""
    gpus = request.resources.num_of_gpus
    processes = processes_per_node(request, gpus)
    env = single_node_rendezvous(processes)
    if env and gpus == processes:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    if env:  # the container's environment holds its secrets: name them, for rank 0 to withhold
        entry = request.study_runtime
        names = {TOKEN_VAR, *request.credentials, *(entry.secret_env if entry else ())}
        env[WITHHELD_ENV] = ",".join(sorted(names))
    return env
