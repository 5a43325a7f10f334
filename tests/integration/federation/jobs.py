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


# Leaves work for the interpreter's exit: a file never closed, an atexit function and a
# non-daemon thread still running. OUT is replaced with a folder the test reads.
LEFT_FOR_EXIT = '''
import atexit
import os
import threading
import time

import atoll.client as fl

OUT = os.environ["ATOLL_WORKDIR"]
fl.init()
site = fl.site_name()
unclosed = open(f"{OUT}/{site}-unclosed.txt", "w")
unclosed.write("flushed at exit\\n")


def late():
    time.sleep(0.5)
    with open(f"{OUT}/{site}-thread.txt", "w") as out:
        out.write("waited for\\n")


atexit.register(lambda: open(f"{OUT}/{site}-atexit.txt", "w").write("ran\\n"))
threading.Thread(target=late).start()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1))
'''


def round_taker(seconds: float) -> str:
    """A site script that prints which round it took (tests read its worker's log for it), then
    takes ``seconds`` to answer with the model it got: a round long enough to kill something in."""
    return f'''
import time
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    print(f"took round {{model.current_round}}", flush=True)
    time.sleep({seconds})
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={{"ok": 1.0}}))
'''


# A 2-round FedAvg job whose server makes the model (model.py:make) and whose app.yaml carries
# the privacy section given: for the tests of sites' privacy.yaml rules.
PRIVACY_APP = """server:
  workflow: fedavg
  args: {{num_rounds: 2, round_timeout: 120}}
  initial_model: model.py:make
site:
  script: train.py
{privacy}"""


def privacy_job(path: Path, privacy: str, train: str, model: str) -> Path:
    return job_folder(path, {"name": path.name, "deploy_map": {"app": ["@ALL"]}},
                      PRIVACY_APP.format(privacy=privacy), {"train.py": train, "model.py": model})
