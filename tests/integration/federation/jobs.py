"""Small job folders for federation tests (the workflow is the minimal scatter_gather)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.federation.harness import job_folder

ECHO = '''
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={"ok": 1.0}))
'''

# Answers nothing and never ends by itself: for abort and crash tests.
STALL = '''
import time
import atoll.client as fl

fl.init()
model = fl.receive()
print("stalling", flush=True)
time.sleep(3600)
'''

CRASH = '''
import atoll.client as fl

fl.init()
model = fl.receive()
raise RuntimeError("the training script broke on purpose")
'''


def app_yaml(rounds: int = 1, payload_bytes: int = 16, round_timeout: float = 120) -> str:
    return (f"server:\n  workflow: scatter_gather\n  args: {{num_rounds: {rounds}, "
            f"payload_bytes: {payload_bytes}, round_timeout: {round_timeout}}}\n"
            "site:\n  script: train.py\n")


def make_job(path: Path, script: str = ECHO, sites: list[str] | None = None,
             min_clients: int | None = None, **app) -> Path:
    meta = {"name": path.name, "deploy_map": {"app": ["server", *sites] if sites else ["@ALL"]}}
    if min_clients is not None:
        meta["min_clients"] = min_clients
    return job_folder(path, meta, app_yaml(**app), {"train.py": script})
