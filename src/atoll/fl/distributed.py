"""Several processes, one federated participant: a site's ranks and the client API.

A site may train with several processes (``torch.distributed``: DDP over the GPUs of a node,
or over several Slurm nodes). Exactly one of them, rank 0, holds the site's link to its
parent; the others never see the job token. Every rank runs the same script and calls the
client API in the same order:

- ``fl.receive()`` (and ``fl.is_running()``): rank 0 takes the task from its parent and
  broadcasts it to the other ranks (its topic, headers and the model's bytes in atoll's own
  safetensors format, never pickle), so every rank gets the same ``fl.Model``.
- ``fl.send()``: only rank 0 answers the parent; on the other ranks it only closes the task.

The broadcast goes over a gloo group of atoll's own (CPU, whatever backend training uses) with
a long timeout: between rounds the other ranks wait while rank 0 waits for the federation.
``fl.init()`` creates the default process group from the launcher's rendezvous variables
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``; backend nccl where CUDA is
available, else gloo) unless the script created it first; its store listens on ``MASTER_ADDR``
alone, never on every interface where that can be avoided (fl/rendezvous.py).

This module imports torch only for a site with several ranks.
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from atoll.fl.channels import Chunk, Task
from atoll.spec.errors import AtollError

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
# Long enough for the slowest round of a federation: a rank other than 0 waits in the
# broadcast while rank 0 waits for its next task.
CONTROL_TIMEOUT = timedelta(days=7)


class RankError(AtollError, RuntimeError):
    """The rank variables are missing or inconsistent; the message names the variable."""


@dataclass(frozen=True)
class Ranks:
    """Where this process stands among the site's processes (PyTorch's variable names)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def leader(self) -> bool:
        """Rank 0: the one process that talks to the parent."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Ranks:
        env = os.environ if environ is None else environ

        def number(name: str, default: int) -> int:
            text = env.get(name, "")
            if not text:
                return default
            if not text.isdigit():
                raise RankError(f"{name}={text!r} is not a non-negative integer (set by the "
                                "site's launcher)")
            return int(text)

        ranks = cls(number("RANK", 0), number("WORLD_SIZE", 1), number("LOCAL_RANK", 0),
                    number("LOCAL_WORLD_SIZE", 1))
        if ranks.world_size < 1 or ranks.rank >= ranks.world_size:
            raise RankError(f"RANK={ranks.rank} is not below WORLD_SIZE={ranks.world_size}")
        if ranks.local_world_size < 1 or ranks.local_rank >= ranks.local_world_size:
            raise RankError(f"LOCAL_RANK={ranks.local_rank} is not below "
                            f"LOCAL_WORLD_SIZE={ranks.local_world_size}")
        return ranks


class NoLink:
    """The channel of a rank other than 0: it has no link to the parent, by design."""

    def __init__(self, job_id: str, site: str):
        self.job_id, self.site = job_id, site

    def receive(self, timeout: float | None = None) -> Task | None:
        raise RankError("only rank 0 receives from the parent; other ranks get each task "
                        "through the broadcast")

    def reply(self, task_id: str, headers: dict[str, Any], payload: Iterable[Chunk]) -> None:
        raise RankError("only rank 0 answers the parent")

    def report(self, event: dict[str, Any]) -> None:
        raise RankError("only rank 0 reports to the parent")


class TaskBroadcast:
    """Shares each task of rank 0 with the other ranks over atoll's own gloo group."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self._group: Any = None

    def setup(self) -> None:
        """Join the default process group (created from the rendezvous variables unless the
        script did) and create atoll's control group. Every rank calls it, in the same order."""
        if self._group is not None:
            return
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            missing = [name for name in RENDEZVOUS_VARS if not os.environ.get(name)]
            if missing:
                raise RankError(f"{', '.join(missing)} not set: a site with several processes "
                                "gets them from its launcher")
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(0 if _one_visible_gpu() else self.ranks.local_rank)
            from atoll.fl.rendezvous import job_store

            store = job_store(self.ranks.rank, self.ranks.world_size)  # on MASTER_ADDR only
            if store is None:
                dist.init_process_group(backend=backend)
            else:
                dist.init_process_group(backend=backend, store=store, rank=self.ranks.rank,
                                        world_size=self.ranks.world_size)
        if dist.get_world_size() != self.ranks.world_size or dist.get_rank() != self.ranks.rank:
            raise RankError(f"torch.distributed has rank {dist.get_rank()} of "
                            f"{dist.get_world_size()}; the launcher set RANK={self.ranks.rank} "
                            f"WORLD_SIZE={self.ranks.world_size}")
        self._group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        # gloo's threads must not outlive the interpreter: a process group still alive at exit
        # aborts its process ("terminate called without an active exception", SIGABRT) after
        # the script has finished. The script may still use the default group after the loop,
        # so it goes at exit; atoll's own group goes when the job ends (close).
        atexit.register(_destroy_default_group)

    def share(self, task: Task | None) -> Task | None:
        """Rank 0 passes its task (None: the job is over); every rank gets the same back."""
        import torch
        import torch.distributed as dist

        self.setup()
        sizes = torch.zeros(3, dtype=torch.int64)
        data = bytearray()  # rank 0's task: its JSON head, then the model's bytes
        if self.ranks.leader and task is not None:
            head = json.dumps({"task_id": task.task_id, "topic": task.topic,
                               "headers": task.headers}).encode()
            data += head
            for chunk in task.chunks:
                data += chunk
            sizes[:] = torch.tensor([1, len(head), len(data) - len(head)])
        dist.broadcast(sizes, src=0, group=self._group)
        present, head_len, payload_len = (int(x) for x in sizes)
        if not present:
            self.close()
            return None
        if self.ranks.leader:
            buffer = torch.frombuffer(data, dtype=torch.uint8)
        else:
            buffer = torch.empty(head_len + payload_len, dtype=torch.uint8)
        dist.broadcast(buffer, src=0, group=self._group)
        view = memoryview(buffer.numpy())
        doc = json.loads(bytes(view[:head_len]))
        return Task(doc["task_id"], doc["topic"], doc["headers"], iter([view[head_len:]]))

    def close(self) -> None:
        """Every rank, once the job is over: wait for the others, then leave atoll's group."""
        if self._group is None:
            return
        import torch.distributed as dist

        dist.barrier(group=self._group)
        dist.destroy_process_group(self._group)
        self._group = None


def _destroy_default_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _one_visible_gpu() -> bool:
    return len([g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]) == 1
