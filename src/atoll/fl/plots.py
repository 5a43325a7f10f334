"""``training_curves.png``: per-metric curves of every site and of the global mean, per round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_PANELS = 6


def plot_training_curves(records: list[dict[str, Any]], path: Path) -> bool:
    """One panel per (phase, metric), a line per site plus a thick one for the global mean.

    Returns False (and draws nothing) when no record has a metric to plot.
    """
    series: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = {}
    for record in records:
        if record["phase"] not in ("train", "validate") or record["round"] is None:
            continue
        for metric, value in record["metrics"].items():
            panel = series.setdefault((record["phase"], metric), {})
            panel.setdefault(record["site"], []).append((record["round"], value))
    # validation panels first: they are what people look at
    panels = sorted(series, key=lambda key: (key[0] != "validate", key))[:MAX_PANELS]
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and workers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = min(len(panels), 3)
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (phase, metric) in zip(axes.flat, panels, strict=False):
        for site, points in sorted(series[(phase, metric)].items()):
            points.sort()
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            if site == "global":
                ax.plot(xs, ys, color="black", linewidth=2.5, label="global (weighted)")
            else:
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=site)
        ax.set_title(f"{phase} {metric}")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
