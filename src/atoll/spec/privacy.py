"""Privacy as data: a job's ``privacy:`` section of app.yaml, a site's ``local/privacy.yaml``,
and the check of one against the other.

Both the site parent (before it runs a job) and the site worker (before its first reply) run
``policy_violations``: the parent refuses a job that asks for less than the site requires,
naming the rule, and the worker refuses to run one too, so a site's demands never rest on the
job's word. Pure data and rules: the filters themselves run in ``atoll.fl.privacy``.

A job's section (every key optional):

```yaml
privacy:
  filters:
    task: [{type: exclude, patterns: ["head.*"]}]        # each site, on every task it receives
    reply:                                               # each site, on every reply with params
      - {type: exclude, patterns: ["*.num_batches_tracked"]}
      - {type: percentile, fraction: 0.1}                # share the largest 10 % of the update
      - {type: clip, max_norm: 1.0}                      # L2 norm of the whole update
      - {type: gaussian, noise_multiplier: 1.0}          # std = 1.0 * the clip before it
      - {type: quantize}                                 # 8-bit on the wire; always last
  dp: {mode: client, clip_norm: 1.0, noise_multiplier: 1.0, delta: 1.0e-5, max_epsilon: 8}
  dp_sgd: {noise_multiplier: 1.0, max_grad_norm: 1.0, delta: 1.0e-5}   # Opacus, in the script
  secure_aggregation: {threshold: 3}       # or {} for the least safe one: more than 2/3 of the sites
  # secure_aggregation: {max_sum: 65536, word_bits: 32}   # the defaults: see docs/privacy.md
```

A site's file:

```yaml
format_version: 1
require:
  exclude: ["head.*"]            # every reply must exclude these patterns
  max_clip_norm: 1.0             # every reply is clipped to at most this L2 norm
  min_noise_multiplier: 1.0      # and noised, after the clip, with std >= this * the clip norm
  secure_aggregation: true       # the server may only learn the sum of the sites' updates
  quantize: true                 # updates leave 8-bit quantized (a quantize reply filter)
budget: {epsilon: 10.0, delta: 1.0e-5}   # per study across jobs (the parent's ledger)
secure_aggregation: {min_participants: 3} # never in a secure sum of fewer sites (itself included)
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from atoll.spec import worker_env
from atoll.spec.errors import Issue, SpecError, issues_from_validation_error

POLICY_FILE = "privacy.yaml"
POLICY_ENV = worker_env.PRIVACY_POLICY  # how a site parent hands its policy to its workers


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- filters ------------------------------------------------------------------------------------


class ExcludeFilter(_Strict):
    type: Literal["exclude"]
    patterns: list[str] = Field(..., min_length=1, description="fnmatch patterns of names.")


class PercentileFilter(_Strict):
    type: Literal["percentile"]
    fraction: float = Field(..., gt=0, le=1, description="Share of entries kept (largest |v|).")


class ClipFilter(_Strict):
    type: Literal["clip"]
    max_norm: float = Field(..., gt=0, description="Largest L2 norm of the whole update.")


class GaussianFilter(_Strict):
    type: Literal["gaussian"]
    noise_multiplier: float = Field(..., gt=0, description="Noise std / the preceding clip's norm.")


class QuantizeFilter(_Strict):
    """Not a change to the values' meaning but to how they travel: 8-bit codes per block
    (atoll.fl.quantization). Always the last step: after clip and noise, DP's included."""

    type: Literal["quantize"]
    bits: Literal[8] = Field(8, description="Bits per value on the wire (8: one byte).")
    block_size: int = Field(256, ge=16, le=65536, description="Values sharing one (lo, step) "
                            "pair; smaller: a finer step, more overhead (8 bytes per block).")
    min_elements: int = Field(1024, ge=1, description="Float tensors with fewer values (biases, "
                              "norms) travel as they are.")


FilterSpec = Annotated[
    ExcludeFilter | PercentileFilter | ClipFilter | GaussianFilter | QuantizeFilter,
    Field(discriminator="type"),
]


def _gaussian_needs_clip(filters: list[Any], where: str) -> None:
    clipped = False
    for i, spec in enumerate(filters):
        clipped = clipped or isinstance(spec, ClipFilter)
        if isinstance(spec, GaussianFilter) and not clipped:
            raise ValueError(f"{where}[{i}]: a gaussian filter needs a clip filter before it "
                             "(its noise is noise_multiplier times that clip's max_norm)")


def _quantize_last(filters: list[Any], where: str) -> None:
    for i, spec in enumerate(filters):
        if isinstance(spec, QuantizeFilter) and i != len(filters) - 1:
            raise ValueError(f"{where}[{i}]: quantize must be the last filter (it is how the "
                             "values travel, after every change to them)")


def quantize_filter(filters: list[Any]) -> QuantizeFilter | None:
    """The ``quantize`` filter of a list (its last entry), or None."""
    return filters[-1] if filters and isinstance(filters[-1], QuantizeFilter) else None


class Filters(_Strict):
    task: list[FilterSpec] = Field(default_factory=list, description="Applied to tasks received "
                                   "(quantize: the server sends the task quantized).")
    reply: list[FilterSpec] = Field(default_factory=list, description="Applied to train replies.")

    @model_validator(mode="after")
    def _noise_after_clip(self) -> Filters:
        _gaussian_needs_clip(self.task, "task")
        _gaussian_needs_clip(self.reply, "reply")
        _quantize_last(self.task, "task")
        _quantize_last(self.reply, "reply")
        return self


class DPSettings(_Strict):
    mode: Literal["client", "server"] = Field(
        "client", description="client: each site clips and noises its update; server: the "
        "server clips each update and noises the sum.")
    clip_norm: float = Field(..., gt=0, description="L2 bound of one site's update.")
    noise_multiplier: float = Field(..., gt=0, description="Noise std / clip_norm.")
    delta: float = Field(1e-5, gt=0, lt=1, description="The delta epsilon is reported at.")
    max_epsilon: float | None = Field(None, gt=0, description="Stop before a round passes it.")


class DPSGDSettings(_Strict):
    noise_multiplier: float = Field(..., gt=0, description="Noise std / max_grad_norm.")
    max_grad_norm: float = Field(..., gt=0, description="L2 bound of one example's gradient.")
    delta: float = Field(1e-5, gt=0, lt=1, description="The delta epsilon is reported at.")


DEFAULT_MAX_SUM = 65536.0
MIN_FRACTION_BITS = 8  # a coarser fixed-point step than 2**-8 would lose the update's detail


def fraction_bits(word_bits: int, max_sum: float) -> int:
    """Bits below the point in a ``word_bits``-bit word that holds sums up to ``max_sum``
    (one bit is the sign): the fixed-point step is 2**-fraction_bits."""
    return word_bits - 1 - math.ceil(math.log2(max_sum))


class SecureAggregation(_Strict):
    threshold: int | None = Field(
        None, ge=2, description="Sites needed to unmask; at least (and by default) the least "
        "number above two thirds of the sites, which every site checks.")
    max_sum: float = Field(
        DEFAULT_MAX_SUM, gt=0, allow_inf_nan=False, description="Largest |sum over the sites "
        "of num_examples x an update entry| the masked sum holds; each site refuses a reply "
        "above its share (max_sum / sites). Larger: a coarser fixed-point step.")
    word_bits: Literal[32, 64] = Field(
        32, description="Width of the masked words of 32-bit (and narrower) variables; 64-bit "
        "variables always have 64-bit words. 64: twice the bytes, a step 2**-32 finer.")

    @model_validator(mode="after")
    def _enough_precision(self) -> SecureAggregation:
        bits = fraction_bits(self.word_bits, self.max_sum)
        if bits < MIN_FRACTION_BITS:
            raise ValueError(
                f"max_sum {self.max_sum:g} leaves {bits} fraction bits in {self.word_bits}-bit "
                f"words (a fixed-point step of 2**{-bits}), fewer than {MIN_FRACTION_BITS}: the "
                "sum would lose its precision; lower max_sum (clip the update, or smaller "
                "num_examples) or set word_bits: 64")
        return self


class PrivacySettings(_Strict):
    filters: Filters = Field(default_factory=Filters)
    dp: DPSettings | None = None
    dp_sgd: DPSGDSettings | None = None  # example-level, in the site script (fl.privacy.dp_sgd)
    secure_aggregation: SecureAggregation | None = None

    @model_validator(mode="after")
    def _central_needs_updates(self) -> PrivacySettings:
        if self.dp is not None and self.dp.mode == "server" and self.secure_aggregation:
            raise ValueError("dp.mode: server clips each site's update at the server, which "
                             "secure aggregation hides from it; use dp.mode: client")
        if self.secure_aggregation is not None and quantize_filter(self.filters.reply):
            raise ValueError("filters.reply: quantize cannot follow secure aggregation's masking "
                             "(masked words are uniformly random: they do not compress); leave "
                             "one of them out")
        return self

    def reply_pipeline(self) -> list[Any]:
        """Every filter a site applies to its train reply, in order (client-mode DP after the
        job's filters, a quantize filter last of all)."""
        quantize = quantize_filter(self.filters.reply)
        pipeline = [spec for spec in self.filters.reply if spec is not quantize]
        if self.dp is not None and self.dp.mode == "client":
            pipeline += [ClipFilter(type="clip", max_norm=self.dp.clip_norm),
                         GaussianFilter(type="gaussian", noise_multiplier=self.dp.noise_multiplier)]
        return pipeline + ([quantize] if quantize is not None else [])

    @property
    def task_quantization(self) -> QuantizeFilter | None:
        """``{type: quantize}`` last in filters.task: the server sends its models 8-bit."""
        return quantize_filter(self.filters.task)

    @property
    def changes_updates(self) -> bool:
        """Whether a site sends its update (diff) rather than its weights."""
        return bool(self.reply_pipeline()) or self.secure_aggregation is not None


def reply_noise(pipeline: list[Any]) -> tuple[float | None, float | None]:
    """(clip norm, noise multiplier) of what finally leaves a site: the last clip's max_norm,
    and the strongest gaussian after it (None when absent)."""
    clip, noise = None, None
    for spec in pipeline:
        if isinstance(spec, ClipFilter):
            clip, noise = spec.max_norm, None  # noise added before a later clip is shrunk by it
        elif isinstance(spec, GaussianFilter) and clip is not None:
            noise = max(noise or 0.0, spec.noise_multiplier)
    return clip, noise


def parse_privacy(data: Any, source: str) -> PrivacySettings:
    try:
        return PrivacySettings.model_validate(data or {})
    except ValidationError as exc:
        raise SpecError(issues_from_validation_error(exc, PrivacySettings, "privacy"),
                        source) from None


def read_app_privacy(app_dir: Path) -> PrivacySettings:
    """The ``privacy`` section of ``app_dir``/app.yaml (empty when it has none)."""
    path = Path(app_dir) / "app.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError([Issue("", f"cannot be read: {exc}")], str(path)) from None
    section = data.get("privacy") if isinstance(data, dict) else None
    return parse_privacy(section, str(path))


# --- a site's policy ----------------------------------------------------------------------------


class Requirements(_Strict):
    exclude: list[str] = Field(default_factory=list, description="Patterns replies must exclude.")
    max_clip_norm: float | None = Field(None, gt=0, description="Largest clip norm allowed.")
    min_noise_multiplier: float | None = Field(None, gt=0, description="Least noise allowed.")
    secure_aggregation: bool = Field(False, description="Replies only through secure sums.")
    quantize: bool = Field(False, description="Updates leave 8-bit quantized (a slow link).")


class Budget(_Strict):
    epsilon: float = Field(..., gt=0, description="This site's epsilon per study, across jobs.")
    delta: float = Field(1e-5, gt=0, lt=1, description="The delta it is measured at.")


class SiteSecureAggregation(_Strict):
    min_participants: int = Field(
        ..., ge=2, description="Fewest sites, this one included, this site masks with and is "
        "summed with; it refuses a secure round of fewer.")


class SitePrivacyPolicy(_Strict):
    format_version: Literal[1]
    require: Requirements = Field(default_factory=Requirements)
    budget: Budget | None = None
    secure_aggregation: SiteSecureAggregation | None = None


def parse_site_policy(data: Any, source: str = f"local/{POLICY_FILE}") -> SitePrivacyPolicy:
    try:
        return SitePrivacyPolicy.model_validate(data)
    except ValidationError as exc:
        raise SpecError(issues_from_validation_error(exc, SitePrivacyPolicy), source) from None


def load_site_policy(local_dir: Path) -> SitePrivacyPolicy | None:
    """``local_dir``/privacy.yaml, or None when the site has none (no requirement)."""
    path = Path(local_dir) / POLICY_FILE
    if not path.exists():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError([Issue("", f"cannot be read: {exc}")], f"local/{POLICY_FILE}") from None
    return parse_site_policy(data)


@dataclass(frozen=True)
class Violation:
    rule: str  # the policy's field, e.g. "require.max_clip_norm"
    reason: str

    def __str__(self) -> str:
        return f"rule {self.rule}: {self.reason}"


def policy_violations(job: PrivacySettings, policy: SitePrivacyPolicy | None) -> list[Violation]:
    """Every way ``job`` asks for less than ``policy`` demands; empty when it complies."""
    if policy is None:
        return []
    found: list[Violation] = []
    need = policy.require
    pipeline = job.reply_pipeline()
    excluded = {p for spec in pipeline if isinstance(spec, ExcludeFilter) for p in spec.patterns}
    missing = [p for p in need.exclude if p not in excluded]
    if missing:
        found.append(Violation("require.exclude", f"the job's replies do not exclude {missing}; "
                               "add them to privacy.filters.reply as {type: exclude, patterns}"))
    clip, noise = reply_noise(pipeline)
    if need.max_clip_norm is not None and (clip is None or clip > need.max_clip_norm):
        found.append(Violation("require.max_clip_norm", f"replies must be clipped to an L2 norm "
                               f"of at most {need.max_clip_norm}; the job clips to "
                               f"{clip if clip is not None else 'nothing'} (privacy.dp.clip_norm "
                               "with mode: client, or a clip filter)"))
    if need.min_noise_multiplier is not None and (
            noise is None or noise < need.min_noise_multiplier):
        found.append(Violation("require.min_noise_multiplier", f"replies must carry Gaussian noise "
                               f"of at least {need.min_noise_multiplier} x the clip norm, added "
                               f"at the site; the job adds {noise or 'none'} (privacy.dp with "
                               "mode: client, or a gaussian filter after the clip)"))
    if need.secure_aggregation and job.secure_aggregation is None:
        found.append(Violation("require.secure_aggregation", "the server may only learn the sum "
                               "of the sites' updates; set privacy.secure_aggregation: {}"))
    if need.quantize and quantize_filter(pipeline) is None:
        found.append(Violation("require.quantize", "this site sends its updates 8-bit "
                               "quantized; add {type: quantize} last in privacy.filters.reply"))
    if policy.budget is not None and noise is None and job.dp_sgd is None:
        found.append(Violation("budget.epsilon", f"this site allows epsilon "
                               f"{policy.budget.epsilon} per study, and the job adds no noise at the "
                               "site, so its epsilon is unbounded; set privacy.dp (mode: client) "
                               "or privacy.dp_sgd"))
    return found
