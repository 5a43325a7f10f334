"""FLARE's small constant modules that Client API scripts import, with FLARE's values.

``atoll job import-flare`` points ``nvflare.app_common.np.constants``,
``nvflare.app_common.app_constant`` and ``nvflare.apis.fl_constant`` here (a name of those
modules that is not below is listed as not translated). The values must be FLARE's: a NumPy
job's initial model travels under ``NPConstants.NUMPY_KEY``, the key FLARE's NumPy persistor
uses, and ``meta[FLMetaKey.NUM_STEPS_CURRENT_ROUND]`` weighs a result in FedAvg.

Only the constants a script reads are here: the task names, the meta keys and model names,
not FLARE's server-side ones.
"""

from __future__ import annotations

__all__ = ["AlgorithmConstants", "AppConstants", "FLMetaKey", "FLModelConst", "MetaKey",
           "ModelName", "NPConstants", "ValidateType"]


class NPConstants:
    NUMPY_KEY = "numpy_key"


class FLMetaKey:
    """Keys of ``FLModel.meta``."""

    NUM_STEPS_CURRENT_ROUND = "NUM_STEPS_CURRENT_ROUND"
    INITIAL_METRICS = "initial_metrics"
    VALIDATE_TYPE = "validate_type"
    START_ROUND = "start_round"
    CURRENT_ROUND = "current_round"
    TOTAL_ROUNDS = "total_rounds"
    JOB_ID = "job_id"
    SITE_NAME = "site_name"
    SUBMIT_MODEL_NAME = "submit_model_name"


class MetaKey(FLMetaKey):
    """FLARE's older name for FLMetaKey (``nvflare.app_common.abstract.fl_model``)."""


class FLModelConst:
    PARAMS_TYPE = "params_type"
    PARAMS = "params"
    OPTIMIZER_PARAMS = "optimizer_params"
    METRICS = "metrics"
    CURRENT_ROUND = "current_round"
    START_ROUND = "start_round"
    TOTAL_ROUNDS = "total_rounds"
    META = "meta"


class AppConstants:
    """The task names and round keys a script compares with."""

    START_ROUND = "start_round"
    CURRENT_ROUND = "current_round"
    CONTRIBUTION_ROUND = "contribution_round"
    NUM_ROUNDS = "num_rounds"
    TASK_TRAIN = "train"
    TASK_VALIDATION = "validate"
    TASK_SUBMIT_MODEL = "submit_model"
    VALIDATE_TYPE = "_validate_type"


class ModelName:
    BEST_MODEL = "best_model"
    FINAL_MODEL = "final_model"


class ValidateType:
    BEFORE_TRAIN_VALIDATE = "before_train_validate"
    MODEL_VALIDATE = "model_validate"


class AlgorithmConstants:
    FEDPROX_MU = "fedprox_mu"
    SCAFFOLD_CTRL_DIFF = "scaffold_c_diff"
    SCAFFOLD_CTRL_GLOBAL = "scaffold_c_global"
