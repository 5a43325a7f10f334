"""Turns the runner's raw results into the Markdown table of BENCHMARKS.md.

The table sits between `<!-- compare:begin -->` and `<!-- compare:end -->`; everything else in
BENCHMARKS.md is left as it is (a missing file or missing markers get the section appended).
Every cell is the median over the repeats of one run of the command; lower is better in
every row, and the last column compares atoll with the better of the two peers.
"""

from __future__ import annotations

import re
from pathlib import Path

from workloads import median_of

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
PEERS = ["flare", "flower"]

PARTIAL_NOTE = (
    "† over the rounds that completed before the job was stopped at the RSS limit "
    "(see the peak RSS row).\n"
)

ROWS = [  # (metric, label, unit)
    ("a_wall_s", "(a) 2 clients, 3 rounds, 4 KiB model: submit → finished", "s"),
    ("a_round_s", "(a) time per round, 4 KiB model", "s"),
    ("b100_round_s", "(b) time per round, 100 MiB model", "s"),
    ("b100_peak_rss", "(b) peak RSS of all processes summed, 100 MiB model", "B"),
    ("b1000_round_s", "(b) time per round, 1 GiB model", "s"),
    ("b1000_peak_rss", "(b) peak RSS of all processes summed, 1 GiB model", "B"),
    ("c_idle_rss", "(c) idle RSS, server + 2 clients (all processes)", "B"),
    ("d_ready_s", "(d) start → ready (admin sees both clients)", "s"),
    ("e_abort_s", "(e) abort → every job process gone", "s"),
    ("f_list_s", "(f) one admin command: list jobs (CLI)", "s"),
]
KEYS = {key for key, _, _ in ROWS}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "B":
        return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def cell(values: list, unit: str, repeats: int) -> tuple[str, float | None]:
    if not values:
        return "not run", None
    med, n, failure = median_of(values)
    if med is None:
        return _short(failure), None
    text = fmt(med, unit)
    if n < repeats:
        text += f" (n={n})"
    return text, med


def ratio(
    atoll: float | None, peers: dict[str, float | None], titles: dict[str, str], unit: str
) -> str:
    known = {k: v for k, v in peers.items() if v}
    if not atoll or not known:
        return "—"
    best = min(known, key=known.get)
    r = known[best] / atoll
    better, worse = ("less", "more") if unit == "B" else ("faster", "slower")
    word = f"{r:.1f}× {better}" if r >= 1 else f"{1 / r:.1f}× {worse}"
    return f"{word} than {titles[best]}"


def render(results: dict, titles: dict[str, str], rows_wanted: set[str], meta: dict) -> str:
    repeats = meta["repeats"]
    lines = [
        BEGIN,
        f"Measured {meta['date']} on this machine ({meta['machine']}), one run of:",
        "",
        f"    {meta['command']}",
        "",
        f"Median of {repeats} repeats per cell (n=… where fewer succeeded); lower is better in "
        "every row. Each repeat provisions and starts a fresh deployment (server and two "
        "clients as separate processes on 127.0.0.1), the repeats of the systems interleaved.",
        "",
        "| workload | NVIDIA FLARE 2.9 | Flower 1.42 | atoll | atoll vs best peer |",
        "| --- | --- | --- | --- | --- |",
    ]
    footnotes: set[str] = set()
    for key, label, unit in ROWS:
        if key not in rows_wanted:
            continue
        cells, medians = {}, {}
        for system in [*PEERS, "atoll"]:
            values = [r[key] for r in results.get(system, []) if key in r]
            cells[system], medians[system] = cell(values, unit, repeats)
        if key.endswith("_round_s"):
            partial = key.replace("_round_s", "_partial_rounds")
            for system in [*PEERS, "atoll"]:
                if any(partial in r for r in results.get(system, [])):
                    cells[system] += " †"
                    footnotes.add(PARTIAL_NOTE)
        peers = {p: medians[p] for p in PEERS}
        lines.append(
            f"| {label} | {cells['flare']} | {cells['flower']} | {cells['atoll']} | "
            f"{ratio(medians['atoll'], peers, titles, unit)} |"
        )
    lines += ["", *sorted(footnotes), *meta["notes"], END]
    return "\n".join(lines)


def write(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = (
            text.rstrip("\n")
            + "\n\n## Side by side with NVIDIA FLARE and Flower\n\n"
            + block
            + "\n"
        )
    path.write_text(text if text.endswith("\n") else text + "\n")


def _short(reason: str, n: int = 60) -> str:
    reason = " ".join(reason.split()).replace("|", "/")
    return reason if len(reason) <= n else reason[: n - 1] + "…"
