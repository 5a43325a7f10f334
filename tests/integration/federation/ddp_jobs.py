"""A FedAvg job whose site script trains with torch.distributed (DDP, gloo, CPU), for the
multi-process tests of the process and Slurm launchers.

Every rank trains on a shard of its own (drawn from a seed of its rank) and, at each round,
appends a record to ``<run folder>/ranks/rank-<r>.jsonl``: its rank variables, the GPU ids it
saw, a digest of its shard and of its parameters after training, and whether it held any of
rank 0's credentials. The tests read these records back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.federation.harness import job_folder

DDP_TRAIN = '''
import hashlib
import json
import os
import sys
import time

import torch

import atoll.client as fl
from atoll.fl.torch_bridge import distributed, load_params, to_params

fl.init()  # joins the process group the launcher prepared (gloo here: no CUDA)
rank = fl.rank()
gen = torch.Generator().manual_seed(1000 + rank)  # this rank's own shard
x = torch.randn(64, 4, generator=gen) + rank
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
net = torch.nn.Linear(4, 1)
ddp = distributed(net)  # DDP: gradients averaged over the site's ranks
out = os.path.join(os.environ["ATOLL_WORKDIR"], "ranks", f"rank-{rank}.jsonl")
os.makedirs(os.path.dirname(out), exist_ok=True)
stall = fl.job_args().get("stall_rank")
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    if model.params:
        load_params(net, model.params)
    if fl.is_evaluate():  # every rank evaluates the global model; rank 0 answers
        loss = float(((net(x) - y) ** 2).mean())
        fl.send(fl.Model(metrics={"loss": loss}, num_examples=len(x)))
        continue
    if fl.job_args().get("raise_rank") == rank:
        raise RuntimeError(f"rank {rank} broke on purpose")
    if stall is not None:
        open(os.path.join(os.path.dirname(out), f"pid-{rank}"), "w").write(str(os.getpid()))
        time.sleep(3600)  # a test kills one rank here, mid-round
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.02)
    for _ in range(5):
        optimizer.zero_grad()
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    params = to_params(net)
    digest = hashlib.sha256(b"".join(params[k].tobytes() for k in sorted(params))).hexdigest()
    record = {
        "round": model.current_round, "rank": rank, "world_size": fl.world_size(),
        "local_rank": fl.local_rank(), "env_rank": os.environ.get("RANK"),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "host": os.environ.get("SLURMD_NODENAME"),
        "shard": hashlib.sha256(x.numpy().tobytes()).hexdigest(), "params": digest,
        "received": hashlib.sha256(b"".join(
            model.params[k].tobytes() for k in sorted(model.params))).hexdigest(),
        "token": "ATOLL_JOB_TOKEN" in os.environ or "ATOLL_CREDENTIALS_FD" in os.environ,
        "secret": "DDP_SECRET" in os.environ, "pid": os.getpid(),
    }
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\\n")
    fl.send(fl.Model(params=params, num_examples=len(x), metrics={"loss": float(loss)}))
'''

INITIAL = '''
import torch


def make():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1).state_dict()
'''


def make_ddp_job(path: Path, sites: list[str], rounds: int = 3,
                 resource_spec: dict[str, Any] | None = None,
                 launcher_spec: dict[str, Any] | None = None,
                 config: dict[str, Any] | None = None) -> Path:
    meta: dict[str, Any] = {"name": path.name, "deploy_map": {"app": ["server", *sites]},
                            "min_clients": len(sites)}
    if resource_spec:
        meta["resource_spec"] = resource_spec
    if launcher_spec:
        meta["launcher_spec"] = launcher_spec
    app_yaml = (
        "server:\n  workflow: fedavg\n"
        f"  args: {{num_rounds: {rounds}, round_timeout: 120}}\n"
        "  initial_model: model.py:make\n"
        f"site:\n  script: train.py\n  config: {json.dumps(config or {})}\n"
    )
    return job_folder(path, meta, app_yaml, {"train.py": DDP_TRAIN, "model.py": INITIAL})


def rank_records(run_folder: Path) -> dict[int, list[dict[str, Any]]]:
    """rank -> its per-round records, in round order."""
    records: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_folder / "ranks").glob("rank-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        records[rows[0]["rank"]] = rows
    return records


def check_ddp_rounds(records: dict[int, list[dict[str, Any]]], world: int, rounds: int) -> None:
    """Every rank trained every round on a shard of its own and ended it with the same
    parameters as the others, from the same model received; only rank 0 held credentials."""
    assert sorted(records) == list(range(world)), records.keys()
    for rank, rows in records.items():
        assert [r["round"] for r in rows] == list(range(1, rounds + 1)), rows
        assert all(r["world_size"] == world and r["env_rank"] == str(rank) for r in rows)
        assert not any(r["token"] for r in rows) or rank == 0, (rank, rows)
    for round_ in range(rounds):
        rows = [records[rank][round_] for rank in range(world)]
        assert len({r["shard"] for r in rows}) == world, rows  # each its own data
        assert len({r["params"] for r in rows}) == 1, rows  # DDP kept them identical
        assert len({r["received"] for r in rows}) == 1, rows  # the same global model
    # Rounds moved the model: FedAvg really ran with the site's result.
    assert len({records[0][i]["received"] for i in range(rounds)}) == rounds
