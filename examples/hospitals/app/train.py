"""A hospital's part of the demo: train on its own records, send back only the weights.

Each site maps the study dataset "records" to a folder holding train.npz and val.npz (written by
`python -m atoll.demo.data prepare`). The model and the training loop are in
atoll.demo.task, shared with the single-site and centralized baselines.
"""

import numpy as np
import torch

import atoll.client as fl
from atoll.demo.task import TrainSettings, evaluate, make_model, private_trainer, train
from atoll.fl.torch_bridge import load_params, to_params

torch.set_num_threads(1)  # tiny model; three sites share two cores in the demo
settings = TrainSettings.from_config(fl.job_args())
records = fl.dataset_path("records")
with np.load(records / "train.npz") as data:
    x_train, y_train = data["x"], data["y"]
with np.load(records / "val.npz") as data:
    x_val, y_val = data["x"], data["y"]
net = make_model()
# the privacy demo's DP-SGD variant (python -m atoll.demo.privacy) sets dp_sgd: true
train_private = private_trainer(net, x_train, y_train, settings) if settings.dp_sgd else None

fl.init()
while fl.is_running():
    model = fl.receive()
    if model.params:  # round 1 without an initial model: every site starts from zeros
        load_params(net, model.params)
    if fl.is_evaluate():
        fl.send(fl.Model(metrics=evaluate(net, x_val, y_val), num_examples=len(y_val)))
        continue
    # rounds count from 1; not the site name: results must not depend on it
    seed = settings.seed + 1000 * model.current_round
    if train_private is not None:
        loss = train_private(settings.epochs)
    else:
        loss = train(net, x_train, y_train, settings.epochs, settings, seed=seed)
    fl.log_metrics({"local_loss": loss}, step=model.current_round)  # metrics files, trackers
    metrics = {"loss": loss, **{f"val_{k}": v for k, v in evaluate(net, x_val, y_val).items()}}
    fl.send(fl.Model(params=to_params(net), num_examples=len(y_train), metrics=metrics))
