"""``app.yaml``: how an app folder names its workflow, site script, arguments and initial model.

```yaml
server:                       # present in the app the server runs
  workflow: fedavg            # fedavg | fedopt | fedprox | scatter_gather | FILE.py:CLASS
  args: {num_rounds: 10, min_clients: 3, key_metric: accuracy}
  initial_model: init.safetensors   # optional: a file in this app folder, or
                                    # model.py:make_model, a function there that makes it
  tracking:                         # optional: experiment tracking (atoll.fl.tracking)
    tensorboard: true
    mlflow: {tracking_uri: "http://mlflow.example.org:5000", experiment: pathology}
site:                         # present in the app the sites run
  script: train.py            # run in-process by the site worker, cwd = this folder
  args: ["--epochs", "2"]     # becomes sys.argv[1:]
  config: {batch_size: 32}    # free JSON-safe settings, read with fl.job_args()
privacy:                      # optional: filters, DP, secure aggregation (docs/privacy.md)
  dp: {mode: client, clip_norm: 1.0, noise_multiplier: 1.0}
```

Validation is strict (unknown keys, wrong types, out-of-range values) and every error of the file
is reported at once, each naming its field (``server.args.num_rounds``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# shared with the site worker's plain check (fl/app_config_plain.py), which needs no pydantic
from atoll.fl.app_config_plain import APP_FILE, AppConfigError, custom_workflow
from atoll.fl.app_config_plain import relative_file as _relative_file
from atoll.spec.privacy import PrivacySettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- workflow arguments -----------------------------------------------------------------------


class RoundArgs(_Strict):
    min_clients: int | None = Field(
        None,
        ge=1,
        description="Results needed per round; default: the job's min_clients, else all sites.",
    )
    round_timeout: float | None = Field(
        None, gt=0, description="Seconds to wait for a round's replies; None waits for every site."
    )


class FedAvgArgs(RoundArgs):
    num_rounds: int = Field(..., ge=1, description="Training rounds.")
    key_metric: str = Field(
        "accuracy", min_length=1, description="Validation metric that picks the best global model."
    )
    key_metric_mode: Literal["max", "min"] = Field("max", description="Whether higher is better.")
    evaluate_every: int = Field(
        1, ge=0, description="Send a 'validate' task every N rounds (and after the last); 0: never."
    )
    cross_site_eval: Literal["none", "global", "all"] = Field(
        "global",
        description="At the end every site evaluates the global model ('global'), and also every "
        "site's last local model ('all').",
    )
    aggregator: Literal["weighted_mean", "median", "trimmed_mean"] = Field(
        "weighted_mean",
        description="How results become the new model: the example-weighted mean, or a robust "
        "coordinate-wise median or trimmed mean (atoll.fl.aggregators).",
    )
    trim_fraction: float = Field(
        0.2, ge=0, lt=0.5, description="trimmed_mean: share of lowest and of highest values cut."
    )
    accumulator: Literal["memory", "disk"] = Field(
        "memory",
        description="weighted_mean: where the round's sum lives. 'disk': an unlinked file in "
        "the server worker's run folder, read and written block by block, so a large model "
        "(bf16 sums in float32: twice its size) needs no second copy in memory.",
    )


class FedProxArgs(FedAvgArgs):
    mu: float = Field(
        0.01, ge=0, description="Proximal term weight, sent to sites as meta.fedprox_mu."
    )


class FedOptArgs(FedAvgArgs):
    optimizer: Literal["adam", "yogi", "adagrad"] = Field("adam", description="Server optimizer.")
    server_lr: float = Field(0.1, gt=0, description="Server learning rate (eta).")
    beta1: float = Field(0.9, ge=0, lt=1, description="First-moment decay.")
    beta2: float = Field(0.99, ge=0, lt=1, description="Second-moment decay.")
    tau: float = Field(1e-3, gt=0, description="Adaptivity (epsilon); v starts at tau**2.")


class ScatterGatherArgs(RoundArgs):
    num_rounds: int = Field(1, ge=1, description="How many times to scatter and gather.")
    payload_bytes: int = Field(1024, ge=0, description="Size of the uint8 array sent to each site.")
    topic: str = Field("train", min_length=1, description="Task topic the sites receive.")


WORKFLOW_ARGS: dict[str, type[RoundArgs]] = {
    "fedavg": FedAvgArgs,
    "fedprox": FedProxArgs,
    "fedopt": FedOptArgs,
    "scatter_gather": ScatterGatherArgs,
}


# --- app.yaml ---------------------------------------------------------------------------------


class MlflowTracking(_Strict):
    tracking_uri: str | None = Field(
        None,
        description="The MLflow tracking server (http(s)://host:port); default: the worker's "
        "MLFLOW_TRACKING_URI. Never credentials: those come from the environment.",
    )
    experiment: str | None = Field(
        None, min_length=1, description="The MLflow experiment; default: the job's name."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parsed = urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"must be an http(s)://host[:port] URL, got {value!r}")
        if parsed.username or parsed.password:
            raise ValueError(
                "must not hold credentials (a job's files are readable by everyone it reaches); "
                "the worker's MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN come from the site's "
                "secret_env"
            )
        return value


class TrackingSection(_Strict):
    tensorboard: bool | None = Field(
        None,
        description="TensorBoard event files under the results' tensorboard/; default: written "
        "when the tensorboard package is installed; true: required.",
    )
    mlflow: MlflowTracking | None = Field(
        None, description="Stream the job's metrics to an MLflow tracking server."
    )


class ServerSection(_Strict):
    workflow: str = Field(
        ...,
        description="The workflow the server worker runs: a built-in "
        f"({' | '.join(WORKFLOW_ARGS)}) or FILE.py:CLASS, a Workflow class of the app folder.",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="The workflow's arguments.")
    initial_model: str | None = Field(
        None,
        description="A .safetensors file in the app folder, or FILE.py:FUNCTION: a function in "
        "a Python file of the app folder that makes the model on the server (for models too big "
        "to ship with the job).",
    )
    tracking: TrackingSection = Field(
        default_factory=TrackingSection,
        description="Experiment tracking of the job's metrics (global and per site), streamed "
        "as the workflow records them.",
    )

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str) -> str:
        custom = custom_workflow(value)
        if custom is None:
            if value not in WORKFLOW_ARGS:
                raise ValueError(
                    f"must be one of {', '.join(WORKFLOW_ARGS)} or FILE.py:CLASS (a workflow "
                    f"class in a file of the app folder), got {value!r}"
                )
            return value
        _relative_file(custom[0], (".py",))
        if not custom[1].isidentifier():
            raise ValueError(f"the part after ':' must name a class, got {custom[1]!r}")
        return value

    @field_validator("initial_model")
    @classmethod
    def _model_file(cls, value: str | None) -> str | None:
        if value is None:
            return None
        file, colon, function = value.partition(":")
        if not colon:
            return _relative_file(value, (".safetensors",))
        _relative_file(file, (".py",))
        if not function.isidentifier():
            raise ValueError(f"the part after ':' must name a function, got {function!r}")
        return value


class SiteSection(_Strict):
    script: str = Field(..., description="The training script, relative to the app folder.")
    args: list[str] = Field(default_factory=list, description="The script's sys.argv[1:].")
    config: dict[str, Any] = Field(default_factory=dict, description="Read with fl.job_args().")

    @field_validator("script")
    @classmethod
    def _script_file(cls, value: str) -> str:
        return _relative_file(value, (".py",))


class AppConfig(_Strict):
    server: ServerSection | None = None
    site: SiteSection | None = None
    # filters, differential privacy, secure aggregation (atoll.spec.privacy; docs/privacy.md)
    privacy: PrivacySettings | None = None


def _model_at(owner: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel]:
    """The model that holds the last key of ``loc`` (for the list of its allowed keys)."""
    for part in loc:
        field = owner.model_fields.get(str(part))
        if field is None:
            break
        nested = [t for t in (field.annotation, *get_args(field.annotation))
                  if isinstance(t, type) and issubclass(t, BaseModel)]
        if not nested:
            break
        owner = nested[0]
    return owner


def _format(error: Any, prefix: tuple[str | int, ...], owner: type[BaseModel]) -> str:
    loc = (*prefix, *error["loc"])
    where = ".".join(str(p) for p in loc) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        owner = _model_at(owner, tuple(error["loc"][:-1]))
        message = f"unknown key (allowed: {', '.join(owner.model_fields)})"
    elif error["type"] == "literal_error":
        message = f"{message}, got {error['input']!r}"
    return f"{where}: {message}"


def parse_app_config(data: Any, source: str = APP_FILE) -> tuple[AppConfig, RoundArgs | None]:
    """Validate a loaded app.yaml and its workflow arguments; raise AppConfigError with all errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AppConfigError(source, [f"(top level): must be a mapping, got {type(data).__name__}"])
    errors: list[str] = []
    config: AppConfig | None = None
    try:
        config = AppConfig.model_validate(data)
    except ValidationError as exc:
        errors = [_format(e, (), AppConfig) for e in exc.errors()]
    args: RoundArgs | None = None
    server = data.get("server")
    if isinstance(server, dict) and server.get("workflow") in WORKFLOW_ARGS:
        args_model = WORKFLOW_ARGS[server["workflow"]]
        raw_args = server.get("args") or {}
        if isinstance(raw_args, dict):
            try:
                args = args_model.model_validate(raw_args)
            except ValidationError as exc:
                errors += [_format(e, ("server", "args"), args_model) for e in exc.errors()]
    if errors or config is None:
        raise AppConfigError(source, errors)
    return config, args


def load_app_config(app_dir: Path) -> tuple[AppConfig, RoundArgs | None]:
    path = Path(app_dir) / APP_FILE
    if not path.is_file():
        raise AppConfigError(str(path), [f"missing: every app folder needs an {APP_FILE}"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise AppConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    return parse_app_config(data, str(path))
