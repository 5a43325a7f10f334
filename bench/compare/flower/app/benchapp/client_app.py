"""ClientApp: adds 1.0 to every weight and replies, marking receive/send times per round."""

from __future__ import annotations

import os
import time

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def _mark(context: Context, event: str, rnd: int) -> None:
    mark_dir = str(context.run_config.get("mark-dir", ""))
    if mark_dir:
        site = f"node-{context.node_id}"
        with open(os.path.join(mark_dir, f"{site}.marks"), "a") as f:
            f.write(f"{event} {rnd} {time.time():.6f}\n")


@app.train()
def train(msg: Message, context: Context) -> Message:
    rnd = int(msg.content["config"].get("server-round", 0))
    _mark(context, "recv", rnd)
    arrays = [a + 1.0 for a in msg.content["arrays"].to_numpy_ndarrays()]
    content = RecordDict(
        {"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": 1})}
    )
    _mark(context, "sent", rnd)
    return Message(content=content, reply_to=msg)
