"""A site's rules for federated statistics: ``statistics:`` of a study in study_runtime.yaml.

```yaml
studies:
  outcomes:
    datasets: {records: {source: /srv/outcomes, mode: ro}}
    statistics:
      min_count: 10     # no statistic, and no histogram bin, about fewer than 10 records
      noise: 0.05       # each released number times (1 + u), u uniform in [-0.05, 0.05]
```

The site owns them: its parent hands them to its workers (``ATOLL_STATISTICS_RULES``, an
atoll-owned variable a study's ``env`` cannot set), atoll's statistics code in the site worker
applies them (``atoll.fl.statistics``), and a job can only ask for stricter ones.
"""

from __future__ import annotations

import json

from pydantic import Field

from atoll.spec.model import NoNullModel

RULES_ENV = "ATOLL_STATISTICS_RULES"
DEFAULT_MIN_COUNT = 10  # when a site sets no rules: secure by default


class StatisticsRules(NoNullModel):
    """What this site's answers to federated statistics may reveal."""

    min_count: int = Field(
        DEFAULT_MIN_COUNT,
        ge=1,
        description="No statistic (count, sum, mean...) of fewer records, and no histogram bin "
        "holding fewer (a bin of 0 is reported as 0)",
    )
    noise: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Relative noise: each released number is multiplied by 1 + u, u drawn "
        "uniformly in [-noise, noise]; 0 releases exact values",
    )

    def to_env(self) -> str:
        return json.dumps({"min_count": self.min_count, "noise": self.noise}, sort_keys=True)
