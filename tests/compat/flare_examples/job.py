"""Builds the FLARE jobs of atoll's FLARE-jobs suite with FLARE 2.9's own recipe classes; run it
with FLARE's Python (bench/compare/setup_peers.sh flare), never atoll's. hello-pt needs torch
(hello-huggingface transformers, hello-tabular-stats pandas): when FLARE's Python has none,
BORROW_TORCH_FROM names a site-packages folder that has them (atoll's venv's), put last on the
path so that FLARE's own packages come first:

    python job.py export OUT_DIR               # recipe.export(): the folders FLARE users get
    python job.py simulate WORKDIR [OUT_JSON]  # FLARE's own simulator (hello-numpy): its final
                                               # model (default hello-numpy/flare_final_model.json)

The recipes' arguments are those of FLARE's hello-world examples.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from nvflare.app_common.np.recipes.fedavg import NumpyFedAvgRecipe
from nvflare.recipe import SimEnv, add_experiment_tracking
from nvflare.recipe.utils import add_cross_site_evaluation

if os.environ.get("BORROW_TORCH_FROM"):
    sys.path.append(os.environ["BORROW_TORCH_FROM"])

HERE = Path(__file__).resolve().parent
HELLO_NUMPY_MODEL = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
# flare_jobs/hello-pt is the older hand-laid job (an app per site): the recipe's is beside it
FOLDER = {"hello-pt": "hello-pt-recipe"}


def recipe(name):
    os.chdir(HERE / name)  # the recipe finds the script from the working directory
    script = "client.py"
    sys.path.insert(0, str(HERE / name))  # the example's own modules (df_stats)
    if name == "hello-pt":  # FLARE's PyTorch recipe, as its hello-pt builds it
        from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe

        made = FedAvgRecipe(name=name, min_clients=2, num_rounds=2,
                            model={"class_path": "model.SimpleNetwork", "args": {}},
                            train_script=script,
                            train_args="--batch_size 16 --epochs 1 --num_workers 0 "
                                       "--train_size 64 --test_size 32")
        add_experiment_tracking(made, tracking_type="tensorboard")
        add_cross_site_evaluation(made)
    elif name == "hello-lightning":  # FLARE's PyTorch recipe, as its hello-lightning builds it
        from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe

        made = FedAvgRecipe(name=name, min_clients=2, num_rounds=2,
                            model={"class_path": "model.LitNet", "args": {}},
                            train_script=script, train_args="--batch_size 32 --epochs 2",
                            key_metric="val_acc_epoch")
    elif name == "hello-huggingface":  # FLARE's PyTorch recipe, as its hello-huggingface builds it
        from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe
        from nvflare.client.config import ExchangeFormat

        made = FedAvgRecipe(name=name, min_clients=2, num_rounds=2,
                            model={"class_path": "model.TinyGPT2", "args": {}},
                            train_script=script, train_args="--local_epochs 1 --batch_size 16",
                            server_expected_format=ExchangeFormat.PYTORCH,  # as FLARE's keeps bf16
                            key_metric="")  # no best-model selection, as in FLARE's example
    elif name == "hello-tabular-stats":  # FLARE's FedStatsRecipe, as its hello-tabular-stats
        from df_stats import SyntheticAdultStatistics
        from nvflare.recipe.fedstats import FedStatsRecipe

        configs = {"count": {}, "mean": {}, "sum": {}, "stddev": {},
                   "histogram": {"*": {"bins": 20}, "Age": {"bins": 10, "range": [0, 100]}},
                   "quantile": {"*": [0.1, 0.5, 0.9]}}
        made = FedStatsRecipe(name=name, stats_output_path="statistics/adults_stats.json",
                              sites=["site-1", "site-2"], statistic_configs=configs,
                              stats_generator=SyntheticAdultStatistics(rows=200))
    elif name == "hello-numpy":
        made = NumpyFedAvgRecipe(name=name, min_clients=2, num_rounds=3, model=HELLO_NUMPY_MODEL,
                                 train_script=script, train_args="--update_type full")
        add_experiment_tracking(made, tracking_type="tensorboard")
    else:
        made = NumpyFedAvgRecipe(name=name, min_clients=2, num_rounds=2,
                                 model=np.array([0.0] * 10), train_script=script, train_args="")
        add_cross_site_evaluation(made)
    return made


def record(result, target=None):
    """FLARE's final global model (NPModelPersistor saves it as server.npy) as JSON."""
    final = np.load(result / "server" / "simulate_job" / "models" / "server.npy")
    text = json.dumps({"dtype": str(final.dtype), "array": final.tolist(),
                       "from": "FLARE 2.9 SimEnv(num_clients=2), job.py simulate"})
    Path(target or HERE / "hello-numpy" / "flare_final_model.json").write_text(text + "\n")


def main(command, where, target=None):
    where = Path(where).resolve()
    if command == "export":
        for name in ("hello-numpy", "hello-numpy-cse", "hello-pt", "hello-lightning",
                     "hello-huggingface", "hello-tabular-stats"):
            staging = where / f".{name}"
            recipe(name).export(str(staging))
            folder = where / FOLDER.get(name, name)
            shutil.rmtree(folder, ignore_errors=True)
            (staging / name).rename(folder)  # export writes DIR/<job name>/
            shutil.rmtree(staging)
    elif command == "simulate":
        run = recipe("hello-numpy").execute(SimEnv(num_clients=2, workspace_root=str(where)))
        record(Path(run.get_result()), target)
    elif command == "record":  # an earlier simulate's workspace
        record(where / "hello-numpy", target)
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(*sys.argv[1:])
