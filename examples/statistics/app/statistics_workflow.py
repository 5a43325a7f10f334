"""Federated statistics: per site and global count, sum, mean, variance, std, min, max,
histograms and quantiles of numeric columns of the table every site maps. No record leaves a
site; each site applies its own rules (min_count, noise) before answering.

Results: statistics.json and histograms.png.
"""

import math

from pydantic import BaseModel, Field

from atoll.fl.statistics import (
    SPREAD,
    SUMMARY,
    combine_summaries,
    histogram_edges,
    quantiles,
    site_spread_stats,
)
from atoll.fl.statistics_plot import plot_histograms
from atoll.workflow import Workflow


class Args(BaseModel):
    columns: list[str] = Field(min_length=1)  # numeric columns of the sites' table
    bins: int = Field(10, ge=1, le=1000)  # histogram bins, over the global [min, max]
    quantiles: list[float] = [0.25, 0.5, 0.75]
    min_count: int | None = Field(None, ge=1)  # ask sites for a stricter min_count
    min_clients: int | None = None
    round_timeout: float | None = 300


class FederatedStatistics(Workflow):
    Args = Args

    def run(self) -> None:
        ctx, args = self.ctx, self.args
        asked = {"columns": args.columns}
        if args.min_count:
            asked["min_count"] = args.min_count
        # 1: count, sum, min, max per site -> global mean and histogram edges
        first = ctx.ask(SUMMARY, args=asked, timeout=args.round_timeout)
        summaries = {s: m.meta["statistics"] for s, m in first.results.items()}
        rules = {s: m.meta.get("rules") for s, m in first.results.items()}
        totals = {c: combine_summaries(summaries, c) for c in args.columns}
        released = [c for c in args.columns if "mean" in totals[c]]
        means = {c: totals[c]["mean"] for c in released}
        edges = {c: histogram_edges(totals[c], args.bins) for c in released}
        # 2: squared deviations from the global mean, histograms over the global edges
        second = ctx.ask(SPREAD, args={**asked, "columns": released, "means": means,
                                       "edges": edges}, timeout=args.round_timeout)
        spreads = {s: m.meta["statistics"] for s, m in second.results.items()}
        result = {"columns": {}, "rules": rules, "notes": [], "failed": {**first.failed,
                                                                          **second.failed}}
        for column in args.columns:
            result["columns"][column] = self.column(column, totals[column], summaries, spreads,
                                                    means, edges, result["notes"])
        ctx.save_json("statistics", result)
        plot_histograms(result["columns"], ctx.result_path("histograms.png"))
        ctx.report({"event": "statistics", "columns": released, "notes": result["notes"]})

    def column(self, column, total, summaries, spreads, means, edges, notes):
        sites = {}
        for site, answer in sorted(summaries.items()):
            if "count" not in answer.get(column, {}):
                notes.append(f"{site}: {column} suppressed: {answer[column]['suppressed']}")
                sites[site] = {"suppressed": answer[column]["suppressed"]}
                continue
            sites[site] = dict(answer[column])
        if column not in means:
            return {"global": total, "sites": sites}
        histogram = [0.0] * self.args.bins
        squared = 0.0
        for site, answer in sorted(spreads.items()):
            part = answer.get(column)
            if not part or "histogram" not in part:
                continue
            squared += part["sum_squared_deviations"]
            for index in part["suppressed_bins"]:
                notes.append(f"{site}: {column} bin {index} ({edges[column][index]:.4g} to "
                             f"{edges[column][index + 1]:.4g}) suppressed: under its min_count")
            histogram = [h + (c or 0.0) for h, c in zip(histogram, part["histogram"], strict=True)]
            own = sites[site]
            own.update(site_spread_stats(own, part, means[column]))
            own["histogram"] = part["histogram"]
            known = [c or 0.0 for c in part["histogram"]]
            own["quantiles"] = quantiles(edges[column], known, self.args.quantiles)
        variance = squared / (total["count"] - 1) if total["count"] > 1 else 0.0
        total.update(variance=variance, std=math.sqrt(variance), histogram=histogram,
                     quantiles=quantiles(edges[column], histogram, self.args.quantiles))
        return {"global": total, "sites": sites, "edges": edges[column]}
