"""Federated statistics: per site and global count, sum, mean, variance, std, min, max,
histograms and quantiles of numeric columns of the table every site maps. No record leaves a
site; each site applies its own rules (min_count, precision, dp...) before answering, and
answers histograms on its own grid (cells of its precision).

Results: statistics.json and histograms.png.
"""

import math

from pydantic import BaseModel, Field

from atoll.fl.statistics import (
    SPREAD,
    SUMMARY,
    combine_histograms,
    combine_summaries,
    quantiles,
    site_spread_stats,
)
from atoll.fl.statistics_plot import plot_histograms
from atoll.workflow import Workflow


class Args(BaseModel):
    columns: list[str] = Field(min_length=1)  # numeric columns of the sites' table
    quantiles: list[float] = [0.25, 0.5, 0.75]
    min_count: int | None = Field(None, ge=1)  # ask sites for a stricter min_count
    min_clients: int | None = None
    round_timeout: float | None = 300


class FederatedStatistics(Workflow):
    Args = Args

    # A server restart runs the query again from its first question, so there is nothing to
    # carry over: each site answers a question asked again with its first answer, noise and
    # all, and spends nothing more for it (atoll.fl.statistics_guard).
    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass

    def run(self) -> None:
        ctx, args = self.ctx, self.args
        asked = {"columns": args.columns}
        if args.min_count:
            asked["min_count"] = args.min_count
        notes = []
        # 1: count, sum, min, max per site -> the global mean
        first = ctx.ask(SUMMARY, args=asked, timeout=args.round_timeout)
        summaries = self.answers(first, notes)
        rules = {s: m.meta.get("rules") for s, m in first.results.items()}
        totals = {c: combine_summaries(summaries, c) for c in args.columns}
        released = [c for c in args.columns if "mean" in totals[c]]
        means = {c: totals[c]["mean"] for c in released}
        # 2: squared deviations from the global mean, each site's histogram on its own grid
        second = ctx.ask(SPREAD, args={**asked, "columns": released, "means": means},
                         timeout=args.round_timeout)
        spreads = self.answers(second, notes)
        result = {"columns": {}, "rules": rules, "notes": notes,
                  "failed": {**first.failed, **second.failed}}
        for column in args.columns:
            result["columns"][column] = self.column(column, totals[column], summaries, spreads,
                                                    means, notes)
        ctx.save_json("statistics", result)
        plot_histograms(result["columns"], ctx.result_path("histograms.png"))
        ctx.report({"event": "statistics", "columns": released, "notes": notes})

    def answers(self, asked, notes):
        out = {}
        for site, model in sorted(asked.results.items()):
            if "refused" in model.meta or "error" in model.meta:
                notes.append(f"{site}: {model.meta.get('refused') or model.meta.get('error')}")
                continue
            out[site] = model.meta["statistics"]
        return out

    def column(self, column, total, summaries, spreads, means, notes):
        sites = {}
        for site, answer in sorted(summaries.items()):
            mine = answer.get(column, {})
            if "count" not in mine:
                why = mine.get("suppressed") or mine.get("refused") or "not answered"
                notes.append(f"{site}: {column} suppressed: {why}")
                sites[site] = {"suppressed": why}
                continue
            sites[site] = dict(mine)
        if column not in means:
            return {"global": total, "sites": sites}
        squared, parts = 0.0, {}
        for site, answer in sorted(spreads.items()):
            part = answer.get(column)
            if not part or "histogram" not in part:
                if part:
                    notes.append(f"{site}: {column} histogram: {part.get('refused') or part}")
                continue
            squared += part["sum_squared_deviations"]
            width, first = part["width"], part["first"]
            edges = [(first + i) * width for i in range(len(part["histogram"]) + 1)]
            for index in part["suppressed_bins"]:
                notes.append(f"{site}: {column} cell {edges[index]:.4g} to "
                             f"{edges[index + 1]:.4g} suppressed: under its min_count or hidden "
                             "with such cells")
            parts[site] = part
            if site not in sites or "count" not in sites[site]:
                continue
            own = sites[site]
            own.update(site_spread_stats(own, part, means[column]))
            own["histogram"], own["edges"] = part["histogram"], edges
            own["quantiles"] = quantiles(edges, [c or 0.0 for c in part["histogram"]],
                                         self.args.quantiles)
        combined = combine_histograms(parts)
        for site, why in combined.get("left_out", {}).items():
            notes.append(f"{site}: {column} histogram left out of the global one: {why}")
        variance = squared / (total["count"] - 1) if total["count"] > 1 else 0.0
        total.update(variance=max(variance, 0.0), std=math.sqrt(max(variance, 0.0)))
        if "histogram" not in combined:
            return {"global": total, "sites": sites}
        total.update(histogram=combined["histogram"],
                     quantiles=quantiles(combined["edges"], combined["histogram"],
                                         self.args.quantiles))
        return {"global": total, "sites": sites, "edges": combined["edges"]}
