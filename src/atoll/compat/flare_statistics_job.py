"""``import-flare`` of a FLARE statistics job (``FedStatsRecipe``): atoll's statistics workflow.

FLARE's export has, on the server, a ``StatisticsController`` workflow with its
``statistic_configs`` and a JSON writer; on each site a ``StatisticsExecutor`` calling the
user's generator component (``df_stats.AdultStatistics`` and its arguments), FLARE's
cleansers and its privacy filter. atoll's job has, on the server, the workflow of ``atoll job
init --workflow stats`` (``statistics_workflow.py``, written into the app) asking for the
columns the importer names (``--column train/Age``: FLARE's export names none, its sites report
their generator's features) and the configs' quantiles; on each site a written script that
makes the generator and serves it (``atoll.compat.flare_statistics.serve_generator``), so that
atoll's code releases every number under the site's own statistics rules. FLARE's cleansers and
filter, and the histogram bins and ranges, are listed: the site's rules decide them.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

CONTROLLERS = ("StatisticsController",)
EXECUTORS = ("StatisticsExecutor",)
WORKFLOW_FILE = "statistics_workflow.py"
SITE_SCRIPT = "flare_statistics_site.py"
SITE_RULES = ("the site's statistics rules (statistics: of its study in study_runtime.yaml: "
              "min_count, precision, dp) decide what leaves")


def server_section(file: str, index: int, workflow: dict[str, Any],
                   components: dict[Any, dict[str, Any]], columns: list[str],
                   not_translated: list[str]) -> dict[str, Any]:
    """The server's part: atoll's statistics workflow over ``columns``."""
    args = dict(workflow.get("args") or {})
    configs = args.pop("statistic_configs", {}) or {}
    at = f"{file} workflows[{index}].args"
    server_args: dict[str, Any] = {"columns": list(columns)}
    quantile = configs.get("quantile") if isinstance(configs, dict) else None
    if isinstance(quantile, dict) and isinstance(quantile.get("*"), list):
        server_args["quantiles"] = [float(q) for q in quantile["*"]]
    for name in sorted(configs) if isinstance(configs, dict) else ():
        if name == "histogram":
            not_translated.append(f"{at}.statistic_configs.histogram: each site answers on "
                                  "its own grid (its statistics precision), not bins and ranges "
                                  "a job chooses")
        elif name == "quantile" and set(quantile or {}) - {"*"}:
            not_translated.append(f"{at}.statistic_configs.quantile: per-feature quantiles; "
                                  "every column gets those of '*'")
        elif name not in ("count", "sum", "mean", "stddev", "variance", "quantile"):
            not_translated.append(f"{at}.statistic_configs.{name}: not a statistic atoll "
                                  "computes")
    writer = args.pop("writer_id", None)
    if writer in components:
        not_translated.append(f"{file} components.{writer}: {components[writer].get('path')} "
                              "(atoll writes statistics.json and histograms.png)")
    args.pop("enable_pre_run_task", None)
    for key in sorted(args):
        not_translated.append(f"{at}.{key}: not an argument of atoll's statistics workflow")
    for cid, component in components.items():
        if cid != writer:
            not_translated.append(f"{file} components.{cid}: {component.get('path')}")
    template = resources.files("atoll.fl").joinpath("templates", "statistics_workflow.py.tmpl")
    return {"workflow": f"{WORKFLOW_FILE}:FederatedStatistics", "args": server_args,
            "_files": {WORKFLOW_FILE: template.read_text(encoding="utf-8")}}


def site_section(file: str, config: dict[str, Any], index: int, executor: dict[str, Any],
                 not_translated: list[str]) -> dict[str, Any] | None:
    """The site's part: a script that serves the executor's generator, or None (and a line in
    ``not_translated``) when the generator is not a component of this config."""
    components = {c.get("id"): c for c in config.get("components") or [] if isinstance(c, dict)}
    generator_id = (executor.get("args") or {}).get("generator_id")
    generator = components.get(generator_id)
    path = generator.get("path") if generator else None
    if not isinstance(path, str) or "." not in path:
        not_translated.append(f"{file} executors[{index}].executor.args.generator_id: "
                              f"{generator_id!r} is not a component with a module path")
        return None
    module, _, name = path.rpartition(".")
    generator_args = generator.get("args") or {}
    # the arguments as JSON text, parsed when the script runs: never code from the config
    script = (
        f'"""Written by atoll job import-flare: FLARE\'s StatisticsExecutor with its generator '
        f'{path}, served\nunder this site\'s statistics rules '
        '(atoll.compat.flare_statistics)."""\n\n'
        "import importlib\nimport json\n\n"
        "from atoll.compat.flare_statistics import serve_generator\n\n"
        f"generator_class = getattr(importlib.import_module({module!r}), {name!r})\n"
        f"serve_generator(generator_class(**json.loads({json.dumps(generator_args)!r})))\n")
    for cid, component in components.items():
        if cid != generator_id:
            not_translated.append(f"{file} components.{cid}: {component.get('path')}: "
                                  f"{SITE_RULES}")
    for key in ("task_data_filters", "task_result_filters"):
        if config.get(key):
            not_translated.append(f"{file} {key}: {SITE_RULES}")
    return {"script": SITE_SCRIPT, "args": [], "_files": {SITE_SCRIPT: script}}
