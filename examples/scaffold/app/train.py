"""A hospital's part: local SGD on its own records; with SCAFFOLD's control variates when the
server sends them (params "c/..."), plain FedAvg local training otherwise."""

import zlib

import numpy as np
from scaffold import client_update, evaluate, gradient, zeros

import atoll.client as fl

config = fl.job_args()
STEPS, LR, BATCH = config["local_steps"], config["lr"], config["batch_size"]  # BATCH 0: full
records = fl.dataset_path("records")
with np.load(records / "train.npz") as data:
    x_train, y_train = data["x"].astype(np.float64), data["y"]
with np.load(records / "val.npz") as data:
    x_val, y_val = data["x"].astype(np.float64), data["y"]


def validate(model):
    return fl.Model(metrics=evaluate(model.params, x_val, y_val), num_examples=len(y_val))


fl.init(evaluate=validate)
# This site's control variate after each round: kept here, never sent whole. Keyed by round,
# so that a round the server runs again (after a server restart) starts from the same c_i.
c_after: dict[int, dict] = {}
while fl.is_running():
    model = fl.receive()
    x = {k: model.params[k] for k in ("w", "b")} if "w" in model.params else zeros()
    rng = np.random.default_rng(config.get("seed", 0) * 1000 + zlib.crc32(fl.site_name().encode())
                                + 7919 * (model.current_round or 0))

    def batch_gradient(params, step, rng=rng):
        if not BATCH:
            return gradient(params, x_train, y_train)
        rows = rng.choice(len(y_train), size=BATCH, replace=False)
        return gradient(params, x_train[rows], y_train[rows])

    if "c/w" not in model.params:  # FedAvg: plain local SGD (no correction)
        c = c_i = zeros()
        y, _ = client_update(x, c, c_i, batch_gradient, STEPS, LR)
        fl.send(fl.Model(params=y, num_examples=len(y_train), metrics=evaluate(y, x_train, y_train)))
        continue
    c = {"w": model.params["c/w"], "b": model.params["c/b"]}
    round_ = model.current_round or 0
    before = [r for r in c_after if r < round_]
    c_i = c_after[max(before)] if before else zeros()
    y, c_new = client_update(x, c, c_i, batch_gradient, STEPS, LR)
    update = {f"dy/{k}": y[k] - x[k] for k in x} | {f"dc/{k}": c_new[k] - c_i[k] for k in x}
    c_after = {r: v for r, v in c_after.items() if r < round_ and r >= round_ - 2}
    c_after[round_] = c_new
    fl.send(fl.Model(params=update, num_examples=len(y_train),
                     metrics=evaluate(y, x_train, y_train)))
