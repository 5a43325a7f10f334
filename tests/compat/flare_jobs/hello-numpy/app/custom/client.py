"""A Client API script in the shape of FLARE 2.9's hello-numpy (written for atoll's tests):
each round adds one to the server's array, logs its mean with FLARE's SummaryWriter and sends
the array back, whole or as its change (--update_type)."""

import argparse

import numpy as np
import nvflare.client as flare
from nvflare.app_common.np.constants import NPConstants
from nvflare.client.tracking import SummaryWriter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--update_type", choices=["full", "diff"], default="full")
    options = parser.parse_args()

    flare.init()
    site = flare.system_info()["site_name"]
    writer = SummaryWriter()
    while flare.is_running():
        received = flare.receive()
        weights = received.params[NPConstants.NUMPY_KEY]
        trained = weights + 1  # the "training": one step up
        mean = float(np.mean(trained))
        writer.add_scalar(tag="weight_mean", scalar=mean, global_step=received.current_round)
        print(f"{site}: round {received.current_round}, mean {mean}")
        if options.update_type == "diff":
            params, kind = trained - weights, flare.ParamsType.DIFF
        else:
            params, kind = trained, flare.ParamsType.FULL
        flare.send(flare.FLModel(params={NPConstants.NUMPY_KEY: params}, params_type=kind,
                                 metrics={"weight_mean": mean},
                                 current_round=received.current_round))


if __name__ == "__main__":
    main()
