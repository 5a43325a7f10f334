"""A job-shipped workflow class that tries to isolate one patient's value at one site from its
federated statistics: the 17-query bisection of issue 32 (histograms with edges it chooses,
count below a cut from the first bin), then what the site's own histogram gives with its
complements (the count minus the released cells), repeated questions, other means and other
min_counts. It saves everything it received and its best interval for the target record."""

from atoll.fl.statistics import SPREAD, SUMMARY
from atoll.workflow import Workflow

COLUMN = "x"


def rank_interval(n, rank, first, width, cells):
    """The cells the record of 0-based ``rank`` can be in, from the released cells (None:
    hidden, known to hold at least 1) and the count ``n``: [lowest edge, highest edge]."""
    hidden = [i for i, c in enumerate(cells) if c is None]
    total = n - sum(c for c in cells if c is not None)  # the complement: the hidden cells' sum
    low = high = None
    shown = 0
    for j, c in enumerate(cells):
        shown += c or 0
        through = sum(1 for i in hidden if i <= j)
        after = len(hidden) - through
        most = shown + (total - after if through else 0)
        least = shown + (through if after else total)
        if low is None and most > rank:
            low = j
        if high is None and least > rank:
            high = j
    high = len(cells) - 1 if high is None else high
    return [(first + low) * width, (first + high + 1) * width]


class Differencing(Workflow):
    def run(self) -> None:
        ctx, log = self.ctx, []
        target = (self.args or {}).get("target", "site-1")

        def ask(task, args):
            got = ctx.ask(task, args=args, targets=[target], timeout=120, min_replies=1)
            meta = got.results[target].meta
            log.append({"task": task, "args": args, "meta": meta})
            return meta.get("statistics", {}).get(COLUMN, {})

        first = ask(SUMMARY, {"columns": [COLUMN]})
        bounds = first.get("bounds", [None, None])  # dp: no min or max, the site's bounds
        n, low, high = first["count"], first.get("min", bounds[0]), first.get("max", bounds[1])
        mean, rank = first["sum"] / n, int(n) // 2
        # 1. bisection on a cut: edges [min, cut, max]; the first bin counts records below cut
        lo, hi, queries = low, high, 0
        for _ in range(17):
            cut = (lo + hi) / 2
            part = ask(SPREAD, {"columns": [COLUMN], "means": {COLUMN: mean},
                                "edges": {COLUMN: [low, cut, high]}})
            histogram = part.get("histogram")
            if not histogram or len(histogram) != 2 or histogram[0] is None:
                break  # refused, or not the edges asked
            queries += 1
            if histogram[0] > rank:
                hi = cut
            else:
                lo = cut
        best = [lo, hi] if queries == 17 else [low, high]
        # 2. the site's own histogram, with the complement n - released cells; asked again;
        #    other means; other min_counts (a suppression level compared with another)
        for mean_asked in (mean, mean, mean + 1.0, mean + 2.0):
            part = ask(SPREAD, {"columns": [COLUMN], "means": {COLUMN: mean_asked}})
            if "width" in part and "histogram" in part and "epsilon" not in part:
                found = rank_interval(n, rank, part["first"], part["width"], part["histogram"])
                if found[1] - found[0] < best[1] - best[0]:
                    best = found
        for min_count in (6, 7, 8):
            ask(SPREAD, {"columns": [COLUMN], "means": {COLUMN: mean}, "min_count": min_count})
        ctx.save_json("attack", {"interval": best, "bisected": queries == 17, "rank": rank,
                                 "min": low, "max": high, "count": n, "log": log})
