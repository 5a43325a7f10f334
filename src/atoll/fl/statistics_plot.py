"""``histograms.png`` of a federated statistics job: one panel per column, a bar chart of the
global histogram with each site's own histogram drawn over it as a step line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def plot_histograms(columns: dict[str, dict[str, Any]], path: Path) -> bool:
    """``columns``: column -> {"edges", "global": {"histogram"}, "sites": {site: {"histogram",
    "edges"}}}.
    Suppressed bins (None) are drawn as 0. Returns False when no column has a histogram, or
    matplotlib is not installed (a warning says so; the statistics themselves are unaffected)."""
    drawable = {c: v for c, v in columns.items() if v.get("edges") and v.get("global", {}).get(
        "histogram")}
    if not drawable:
        return False
    try:
        import matplotlib
    except ImportError as exc:
        log.warning("no %s: %s (install matplotlib)", Path(path).name, exc)
        return False
    matplotlib.use("Agg")  # no display on servers and workers
    import matplotlib.pyplot as plt

    cols = min(len(drawable), 2)
    rows = (len(drawable) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.8 * rows), squeeze=False)
    for ax, (column, data) in zip(axes.flat, sorted(drawable.items()), strict=False):
        edges = data["edges"]
        widths = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]
        counts = [c or 0 for c in data["global"]["histogram"]]
        ax.bar(edges[:-1], counts, width=widths, align="edge", color="lightgray",
               edgecolor="gray", label="global")
        for site, site_data in sorted(data.get("sites", {}).items()):
            histogram = site_data.get("histogram")
            if histogram:
                ax.stairs([c or 0 for c in histogram], site_data.get("edges", edges), label=site,
                          linewidth=1.5)  # a site's own grid
        ax.set_title(column)
        ax.set_ylabel("records")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(drawable):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
