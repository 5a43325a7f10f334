"""What a site worker's reply carries, whatever the task was called: the egress classifier.

A site's privacy policy holds for everything its worker sends back, not for a task name: a
job's server-side workflow chooses its task names ("train", "evaluate", "submit_model", ...)
and may ask as often as it likes. ``SitePrivacy.on_reply`` sorts each reply by its content:

- ``UPDATE``: any params (weights or a diff). The site's whole reply pipeline: its filters, DP
  clip and noise with the release accounted in the study's ledger, secure aggregation masking.
- ``METRICS``: no params; a bounded number of scalar metrics and scalar meta (plus the
  fl.log_metrics values riding along). Sent as they are (the site's approved script chose
  them; docs/privacy.md says what that leaves open), without the example count when secure
  aggregation is on.
- ``STATISTICS``: no params; the answer of atoll.fl.statistics (``meta["statistics"]``), which
  applies the site's statistics rules to it. Params beside it are not a statistics reply.
- ``UNKNOWN``: anything else (nested meta, oversized text, too many metrics). Refused where the
  site requires privacy: nothing the policy cannot classify leaves the site.
"""

from __future__ import annotations

import json
import math
from typing import Any

from atoll.fl.metrics_log import LOGGED_KEY, MAX_LOGGED
from atoll.fl.model import Model

UPDATE, METRICS, STATISTICS, UNKNOWN = "update", "metrics", "statistics", "unknown"
STATISTICS_KEYS = frozenset({"statistics", "rules"})  # what atoll.fl.statistics.serve sends
MAX_METRICS = 256  # scalars per reply: a loss, an accuracy, a few per class
MAX_TEXT = 256  # characters of one meta text value (an error message, a name)
MAX_META_BYTES = 16 * 1024  # the whole meta as JSON, logged metrics aside


def _scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _logged_ok(value: Any) -> str | None:
    """Why fl.log_metrics values riding along are not what the runtime puts there, or None."""
    if not isinstance(value, list) or len(value) > MAX_LOGGED:
        return f"meta[{LOGGED_KEY!r}] is not a list of at most {MAX_LOGGED} entries"
    for entry in value:
        if not isinstance(entry, dict) or set(entry) - {"round", "step", "metrics"}:
            return f"meta[{LOGGED_KEY!r}] holds an entry that is not round, step and metrics"
        metrics = entry.get("metrics")
        if not (_scalar(entry.get("round")) and _scalar(entry.get("step"))
                and isinstance(metrics, dict) and len(metrics) <= MAX_METRICS
                and all(isinstance(k, str) and len(k) <= MAX_TEXT and isinstance(v, int | float)
                        for k, v in metrics.items())):
            return f"meta[{LOGGED_KEY!r}] holds metrics that are not named numbers"
    return None


def classify(model: Model) -> tuple[str, str]:
    """(kind, why): the kind of what ``model`` carries; why is set for UNKNOWN."""
    meta = dict(model.meta)
    if len(model.metrics) > MAX_METRICS:
        return UNKNOWN, f"{len(model.metrics)} metrics (at most {MAX_METRICS} are scalars)"
    bad = [k for k, v in model.metrics.items()
           if not isinstance(k, str) or len(k) > MAX_TEXT or not isinstance(v, int | float)]
    if bad:
        return UNKNOWN, f"metrics {bad[:3]} are not named numbers"
    if LOGGED_KEY in meta:
        why = _logged_ok(meta.pop(LOGGED_KEY))
        if why:
            return UNKNOWN, why
    statistics = STATISTICS_KEYS & set(meta)
    if statistics:
        if model.params:
            return UNKNOWN, "params beside a statistics answer (a reply is one or the other)"
        if "statistics" not in meta:
            return UNKNOWN, "statistics rules without a statistics answer"
        rest = {k: v for k, v in meta.items() if k not in STATISTICS_KEYS}
        if not all(_scalar(v) for v in rest.values()):
            return UNKNOWN, "non-scalar meta beside a statistics answer"
        return STATISTICS, ""
    nested = sorted(str(k) for k, v in meta.items() if not _scalar(v))
    if nested:
        return UNKNOWN, (f"meta {nested[:5]} holds values other than numbers and short text "
                         f"(at most {MAX_TEXT} characters)")
    if len(json.dumps(meta, default=str)) > MAX_META_BYTES:
        return UNKNOWN, f"meta of more than {MAX_META_BYTES} bytes"
    return (UPDATE, "") if model.params else (METRICS, "")
