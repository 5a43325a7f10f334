"""A clinic's part: local SGD on its records. The clinic named in ``poisoned_site`` is an
attacker: it sends its update reversed and amplified (x - scale * (y - x)) instead of y."""

import numpy as np
from model import evaluate, train, zeros

import atoll.client as fl

config = fl.job_args()
records = fl.dataset_path("records")
with np.load(records / "train.npz") as data:
    x_train, y_train = data["x"].astype(np.float64), data["y"]
with np.load(records / "val.npz") as data:
    x_val, y_val = data["x"].astype(np.float64), data["y"]
attacker = fl.site_name() == config.get("poisoned_site")


def validate(model):
    return fl.Model(metrics=evaluate(model.params, x_val, y_val), num_examples=len(y_val))


fl.init(evaluate=validate)
while fl.is_running():
    model = fl.receive()
    start = {k: model.params[k] for k in ("w", "b")} if model.params else zeros()
    rng = np.random.default_rng(config["seed"] + (model.current_round or 0))
    params = train(start, x_train, y_train, config["epochs"], config["lr"], config["batch_size"],
                   rng)
    if attacker:
        params = {k: start[k] - config["poison_scale"] * (params[k] - start[k]) for k in params}
    fl.send(fl.Model(params=params, num_examples=len(y_train),
                     metrics=evaluate(params, x_train, y_train)))
