"""A Client API script in the shape of FLARE 2.9's hello-numpy-cross-val (written for atoll's
tests): trains as hello-numpy does, answers validate tasks with the model's mean, and submits
its last trained array when asked for its model."""

import numpy as np
import nvflare.client as flare
from nvflare.app_common.abstract.fl_model import ParamsType
from nvflare.app_common.np.constants import NPConstants


def main():
    flare.init()
    last = None
    while flare.is_running():
        received = flare.receive()
        params = received.params or {}
        if flare.is_train():
            if NPConstants.NUMPY_KEY not in params:
                raise RuntimeError("the train task carried no model")
            last = params[NPConstants.NUMPY_KEY] + 1
            flare.send(flare.FLModel(params={NPConstants.NUMPY_KEY: last},
                                     params_type=ParamsType.FULL,
                                     metrics={"weight_mean": float(np.mean(last))}))
        elif flare.is_evaluate():
            metrics = ({"weight_mean": float(np.mean(params[NPConstants.NUMPY_KEY]))}
                       if NPConstants.NUMPY_KEY in params else {})
            flare.send(flare.FLModel(metrics=metrics))
        elif flare.is_submit_model():
            if last is None:
                raise RuntimeError("asked for a model before any training")
            flare.send(flare.FLModel(params={NPConstants.NUMPY_KEY: last},
                                     params_type=ParamsType.FULL))
        else:
            flare.send(flare.FLModel(metrics={}))


if __name__ == "__main__":
    main()
