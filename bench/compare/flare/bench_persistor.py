"""Server-side model source for the FLARE peer job: the benchmark's model, made in place.

The model is a dict of float32 layers whose sizes the runner chooses, identical to what the
Flower and atoll jobs use. Saving is skipped on purpose: no peer writes its model to disk in
this benchmark, so FLARE is not charged for a checkpoint the others do not make.
"""

from __future__ import annotations

import numpy as np
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import ModelLearnable, make_model_learnable
from nvflare.app_common.abstract.model_persistor import ModelPersistor


class BenchModelPersistor(ModelPersistor):
    def __init__(self, layer_elems: list, seed: int = 0):
        super().__init__()
        self.layer_elems = [int(n) for n in layer_elems]
        self.seed = int(seed)

    def load_model(self, fl_ctx: FLContext) -> ModelLearnable:
        rng = np.random.default_rng(self.seed)
        weights = {
            f"layer{i}": rng.random(n, dtype=np.float32) for i, n in enumerate(self.layer_elems)
        }
        return make_model_learnable(weights=weights, meta_props={})

    def save_model(self, model_learnable: ModelLearnable, fl_ctx: FLContext):
        return None
