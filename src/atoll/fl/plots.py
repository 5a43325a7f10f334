"""``training_curves.png``: per-metric curves of every site and of the global mean, per round,
and of what site scripts passed to ``fl.log_metrics`` (phase ``log``), per step."""

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
        x = _x(record)
        if x is None:
            continue
        for metric, value in record["metrics"].items():
            panel = series.setdefault((record["phase"], metric), {})
            panel.setdefault(record["site"], []).append((x, value))
    # validation panels first: they are what people look at; then training, then logged values
    order = {"validate": 0, "train": 1, "log": 2}
    panels = sorted(series, key=lambda key: (order[key[0]], key))[:MAX_PANELS]
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
        ax.set_title(f"fl.log_metrics {metric}" if phase == "log" else f"{phase} {metric}")
        ax.set_xlabel("step" if phase == "log" else "round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _x(record: dict[str, Any]) -> int | None:
    """Where a record goes on its curve: its round, or a logged value's own step (else its
    round); None for what has no place on a curve (cross-site results)."""
    if record["phase"] == "log":
        step = record.get("step")
        return step if step is not None else record["round"]
    if record["phase"] in ("train", "validate"):
        return record["round"]
    return None
