"""Lightning on a site's ranks: ``trainer_args()`` over two real processes (gloo, CPU).

Both processes run one script with ``L.Trainer(**trainer_args())`` and atoll's callback, as the
launcher would start them. Rank 0 holds a list-backed channel with two train tasks; rank 1 holds
NoLink, which raises on any use. Each prints what it saw as JSON for the test.
"""

from __future__ import annotations

import pytest

from tests.unit.fl.ranks import run_two_ranks

pytest.importorskip("lightning")

PROGRAM = r'''
import json, os
import numpy as np
import torch
import lightning.pytorch as L
from torch.utils.data import DataLoader, TensorDataset
from atoll.fl.channels import Task
from atoll.fl.client_runtime import ClientSession, bind
from atoll.fl.distributed import NoLink, Ranks
from atoll.fl.model import Model
from atoll.fl.serde import decode, encode
import atoll.client as fl
from atoll.fl.lightning_callback import FederatedCallback, trainer_args

GLOBALS = [{"net.weight": np.full((1, 4), float(i), np.float32),
            "net.bias": np.full(1, -float(i), np.float32)} for i in range(2)]

class ListChannel:
    job_id, site = "job", "site-a"
    def __init__(self):
        self.tasks = [Task(f"t{i}", "train", {"round": i}, iter(list(encode(Model(params=p)))))
                      for i, p in enumerate(GLOBALS)]
        self.replies = []
    def receive(self, timeout=None):
        return self.tasks.pop(0) if self.tasks else None
    def reply(self, task_id, headers, payload):
        model = decode(payload)
        self.replies.append({"task": task_id, "num_examples": model.num_examples,
                             "params": {k: v.tolist() for k, v in model.params.items()}})
    def report(self, event):
        pass

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen, self.started_from = [], []
    def on_train_epoch_start(self):
        if self.current_epoch % 2 == 0:  # the first epoch of the round
            self.started_from.append(self.net.bias.item())
    def training_step(self, batch, _):
        index, x, y = batch
        self.seen.append(sorted(index.tolist()))
        return torch.nn.functional.mse_loss(self(x).squeeze(1), y)
    def forward(self, x):
        return self.net(x)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

ranks = Ranks.from_env()
channel = ListChannel() if ranks.leader else NoLink("job", "site-a")
bind(ClientSession(channel, "site-a", ranks=ranks))
gen = torch.Generator().manual_seed(0)  # the site's data, loaded by every rank; DDP shards it
data = TensorDataset(torch.arange(16), torch.randn(16, 4, generator=gen),
                     torch.randn(16, generator=gen))
loader = DataLoader(data, batch_size=4)
module = Net()
trainer = L.Trainer(max_epochs=2, callbacks=[FederatedCallback()], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, **trainer_args())
fl.init()
rounds = []
while fl.is_running():
    fl.receive()
    trainer.fit(module, loader)
    rounds.append({name: p.detach().tolist() for name, p in module.named_parameters()})
listening = []  # where rank 0's rendezvous store listens: MASTER_ADDR alone, not Lightning's
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == int(os.environ["MASTER_PORT"]):
            listening.append(local.rsplit(":", 1)[0])
print(json.dumps({"listening": listening, "strategy": type(trainer.strategy).__name__,
                  "global_rank": trainer.global_rank, "world": trainer.world_size,
                  "local_rank": trainer.local_rank, "node_rank": trainer.node_rank,
                  "seen": module.seen,
                  "started_from": module.started_from, "rounds": rounds,
                  "replies": getattr(channel, "replies", None)}))
'''


def _epochs(batches: list[list[int]]) -> list[set[int]]:
    """The examples of each epoch: two batches of four."""
    return [set(batches[i]) | set(batches[i + 1]) for i in range(0, len(batches), 2)]


def test_lightning_trains_with_ddp_on_the_ranks_the_launcher_started():
    zero, one = run_two_ranks(PROGRAM, timeout=240)
    # Lightning's DDP on atoll's ranks: no process of its own, the launcher's numbering.
    assert zero["strategy"] == one["strategy"] == "DDPStrategy"
    assert [zero["global_rank"], one["global_rank"], zero["world"], one["world"]] == [0, 1, 2, 2]
    assert [zero["local_rank"], one["local_rank"], one["node_rank"]] == [0, 1, 0]
    assert zero["listening"] == ["0100007F"]  # atoll's store on 127.0.0.1, not env:// on all
    # Each rank trained its own half of the data, every epoch: 2 rounds x 2 epochs x 2 batches.
    assert len(zero["seen"]) == len(one["seen"]) == 8
    for a, b in zip(_epochs(zero["seen"]), _epochs(one["seen"]), strict=True):
        assert not a & b and a | b == set(range(16))
    # Every rank began each round from the task's global model, and DDP kept them equal.
    assert zero["started_from"] == one["started_from"] == [0.0, -1.0]
    assert zero["rounds"] == one["rounds"]
    # Rank 0 answered each task for the site with the trained weights and the site's examples.
    assert [r["task"] for r in zero["replies"]] == ["t0", "t1"] and one["replies"] is None
    for reply, trained in zip(zero["replies"], zero["rounds"], strict=True):
        assert reply["num_examples"] == 16
        assert reply["params"] == {k: trained[k] for k in ("net.weight", "net.bias")}
