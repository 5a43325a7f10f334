"""The hostile job's server-side code (``server.initial_model: model.py:make``), which the
server worker runs: every attack (attacks.py), then a model, so that the job goes on."""

import attacks
import numpy as np


def make():
    attacks.run("server")
    return {"w": np.zeros(4, dtype=np.float32)}
