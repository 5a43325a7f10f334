"""A hospital's turn: train the model it receives on its own records, pass it on."""

import numpy as np
from model import evaluate, train, zeros

import atoll.client as fl

config = fl.job_args()
records = fl.dataset_path("records")
with np.load(records / "train.npz") as data:
    x_train, y_train = data["x"].astype(np.float64), data["y"]
with np.load(records / "val.npz") as data:
    x_val, y_val = data["x"].astype(np.float64), data["y"]

fl.init()
while fl.is_running():
    model = fl.receive()
    params = {k: model.params[k] for k in ("w", "b")} if model.params else zeros()
    rng = np.random.default_rng(config["seed"] + (model.current_round or 0))
    params = train(params, x_train, y_train, config["epochs"], config["lr"],
                   config["batch_size"], rng)
    fl.send(fl.Model(params=params, num_examples=len(y_train),
                     metrics=evaluate(params, x_val, y_val)))
