"""Several ranks, one participant: the client API over two real processes (gloo, CPU).

Rank 0 holds a list-backed channel (two train tasks, then the end); rank 1 holds NoLink, which
raises on any use. Both run the same loop; each prints what it saw as JSON for the test.
"""

from __future__ import annotations

import pytest

from atoll.fl.distributed import RankError, Ranks
from tests.unit.fl.ranks import run_two_ranks

PROGRAM = r'''
import json, sys
import numpy as np
from atoll.fl.channels import Task
from atoll.fl.client_runtime import ClientSession, bind
from atoll.fl.distributed import NoLink, Ranks
from atoll.fl.model import Model
from atoll.fl.serde import encode
import atoll.client as fl

class ListChannel:
    job_id, site = "job", "site-a"
    def __init__(self):
        self.tasks = [Task(f"t{i}", "train", {"round": i},
                           iter(list(encode(Model(params={"w": np.full(3, i, np.float32)})))))
                      for i in range(2)]
        self.replies, self.reports = [], []
    def receive(self, timeout=None):
        return self.tasks.pop(0) if self.tasks else None
    def reply(self, task_id, headers, payload):
        self.replies.append(task_id)
    def report(self, event):
        self.reports.append(event)

ranks = Ranks.from_env()
channel = ListChannel() if ranks.leader else NoLink("job", "site-a")
bind(ClientSession(channel, "site-a", ranks=ranks))
fl.init()
seen = []
while fl.is_running():
    model = fl.receive()
    seen.append([model.current_round, model.params["w"].tolist()])
    fl.log_metrics({"loss": 1.0})
    fl.send(fl.Model(params={"w": model.params["w"] + 1}, num_examples=1))
print(json.dumps({"rank": fl.rank(), "world": fl.world_size(), "local": fl.local_rank(),
                  "seen": seen, "replies": getattr(channel, "replies", None),
                  "reports": len(getattr(channel, "reports", []))}))
'''


def test_every_rank_gets_each_task_and_only_rank_0_answers(tmp_path):
    zero, one = run_two_ranks(PROGRAM)
    assert zero["seen"] == one["seen"] == [[0, [0.0, 0.0, 0.0]], [1, [1.0, 1.0, 1.0]]]
    assert (zero["rank"], one["rank"], one["world"], one["local"]) == (0, 1, 2, 1)
    assert zero["replies"] == ["t0", "t1"] and zero["reports"] == 2  # rank 0 answered for both
    assert one["replies"] is None  # rank 1 had no channel to answer through


def test_one_process_is_rank_0_of_1_without_torch_distributed():
    assert Ranks.from_env({}) == Ranks(0, 1, 0, 1)
    assert not Ranks.from_env({}).distributed


@pytest.mark.parametrize(("env", "named"), [
    ({"RANK": "x"}, "RANK='x'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"LOCAL_RANK": "1"}, "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"),
])
def test_bad_rank_variables_are_named(env, named):
    with pytest.raises(RankError, match=named.replace("[", r"\[")):
        Ranks.from_env(env)
