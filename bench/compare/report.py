"""Turns the runner's raw results into the Markdown table of BENCHMARKS.md.

The table sits between `<!-- compare:begin -->` and `<!-- compare:end -->`; everything else in
BENCHMARKS.md is left as it is (a missing file or missing markers get the section appended).
Every cell is the median over the repeats of one run of the command; lower is better in
every row, and the last column compares atoll with the better of the two peers.

A run with `atoll-unconfined` (atoll with `process: {sandbox: none}`) also writes the sandbox's
cost, atoll against atoll-unconfined, between `<!-- sandbox-cost:begin -->` and
`<!-- sandbox-cost:end -->` (render_sandbox).
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

from workloads import median_of

BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
HEADING = "Side by side with NVIDIA FLARE and Flower"
PEERS = ["flare", "flower"]
SANDBOX_BEGIN, SANDBOX_END = "<!-- sandbox-cost:begin -->", "<!-- sandbox-cost:end -->"
SANDBOX_HEADING = "The process launcher's sandbox: its cost per job"
# issue 19: with the sandbox, these may be at most this much slower than without it
SANDBOX_LIMITS = {"a_wall_s": 0.05, "b1000_round_s": 0.05}
NETWORK_BEGIN, NETWORK_END = "<!-- network-cost:begin -->", "<!-- network-cost:end -->"
NETWORK_HEADING = "The process launcher's network sandbox: its cost per job"
# issue 32: with the workers' own network namespaces, at most this much slower than without
NETWORK_LIMITS = {"a_wall_s": 0.05, "b100_round_s": 0.05}
PROVENANCE_BEGIN, PROVENANCE_END = "<!-- provenance-cost:begin -->", "<!-- provenance-cost:end -->"
PROVENANCE_HEADING = "The provenance record: its cost per job"
# issue 38: with the record, at most this much slower than without it
PROVENANCE_LIMITS = {"a_wall_s": 0.02, "b100_round_s": 0.02}
CHECKPOINT_BEGIN, CHECKPOINT_END = "<!-- checkpoint-cost:begin -->", "<!-- checkpoint-cost:end -->"
CHECKPOINT_HEADING = "The per-round checkpoint: its cost and size per job"
# issue 37: with the server's per-round checkpoint, at most this much slower than without it
CHECKPOINT_LIMITS = {"a_wall_s": 0.05, "b100_round_s": 0.05}
CHECKPOINT_SIZES = [  # (metric, workload)
    ("a_checkpoint_bytes", "(a) 4 KiB model"),
    ("b100_checkpoint_bytes", "(b) 100 MiB model"),
    ("b1000_checkpoint_bytes", "(b) 1 GiB model"),
]
SANDBOX_ROWS = [  # (metric, label, unit)
    ("a_wall_s", "(a) 2 clients, 3 rounds, 4 KiB model: submit → finished", "s"),
    ("a_round_s", "(a) time per round, 4 KiB model", "s"),
    ("a_cpu_s", "(a) CPU time of all processes, 4 KiB job", "cpu"),
    ("a_others_cores", "(a) other load on the machine during the 4 KiB job", "cores"),
    ("b100_round_s", "(b) time per round, 100 MiB model", "s"),
    ("b100_peak_rss", "(b) peak RSS of all processes summed, 100 MiB model", "B"),
    ("b100_cpu_s", "(b) CPU time of all processes, 100 MiB job", "cpu"),
    ("b1000_round_s", "(b) time per round, 1 GiB model", "s"),
    ("b1000_peak_rss", "(b) peak RSS of all processes summed, 1 GiB model", "B"),
    ("b1000_cpu_s", "(b) CPU time of all processes, 1 GiB job", "cpu"),
    ("b1000_others_cores", "(b) other load on the machine during the 1 GiB job", "cores"),
]

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
    if unit == "cpu":
        return f"{value:.1f} CPU-s"
    if unit == "cores":
        return f"{value:.2f} cores"
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


def render_sandbox(
    results: dict, titles: dict[str, str], rows_wanted: set[str], meta: dict
) -> str:
    """atoll (workers under bwrap) against atoll-unconfined (`sandbox: none`), one run."""
    return _render_cost(results, titles, rows_wanted, meta, off="atoll-unconfined",
                        marks=(SANDBOX_BEGIN, SANDBOX_END), limits=SANDBOX_LIMITS,
                        on_label="sandbox: bwrap", cost_label="sandbox's cost")


def render_network(
    results: dict, titles: dict[str, str], rows_wanted: set[str], meta: dict
) -> str:
    """atoll (workers in their own network namespaces) against atoll-hostnet (`network: host`,
    still under bwrap), one run."""
    intro = (
        f"Median of {meta['repeats']} repeats per cell (the repeats in brackets, in the order "
        "run); lower is better. Each repeat provisions and starts a fresh deployment (server and "
        "two sites as separate processes on 127.0.0.1, mutual TLS, the process launcher), the "
        "two variants alternating A B, B A, A B, … Both run every job worker under bubblewrap. "
        "With the network sandbox: the kits as `atoll provision` makes them (`process.network` "
        "isolated, the default): each worker in a network namespace of its own, dialling its "
        "parent's unix socket. Without: `process: {network: host}` set in the server's and each "
        "site's local/site.yaml after provisioning: workers on the host's network, dialling "
        "their parent on TCP loopback. CPU time and other load as in the sandbox table. The "
        "cost is the difference of the medians, in per cent of the time without; issue 32 "
        "allows at most +5 % for the tiny job and for the 100 MiB round.")
    return _render_cost(results, titles, rows_wanted, meta, off="atoll-hostnet",
                        marks=(NETWORK_BEGIN, NETWORK_END), limits=NETWORK_LIMITS,
                        on_label="network: isolated", cost_label="network sandbox's cost",
                        intro=intro)


def render_provenance(
    results: dict, titles: dict[str, str], rows_wanted: set[str], meta: dict
) -> str:
    """atoll (each job's signed provenance record) against atoll-noprov (none), one run."""
    intro = (
        f"Median of {meta['repeats']} repeats per cell (the repeats in brackets, in the order "
        "run); lower is better. Each repeat provisions and starts a fresh deployment (server and "
        "two sites as separate processes on 127.0.0.1, mutual TLS, the process launcher, "
        "workers under bubblewrap), the two variants alternating A B, B A, A B, … With the "
        "record: the parents as `atoll provision` makes them: the server signs and appends its "
        "entries (the signed job, its intake, the final model's and metrics' digests), each "
        "site signs its decision and launch entries, the download exports the record. Without: "
        "the parents started with ATOLL_BENCHMARK_NO_PROVENANCE=1 (for benchmarks only). The "
        "server worker's per-round model digests run in both. CPU time and other load as in "
        "the sandbox table. The cost is the difference of the medians, in per cent of the time "
        "without; issue 38 allows at most +2 % for the tiny job and for the 100 MiB round.")
    return _render_cost(results, titles, rows_wanted, meta, off="atoll-noprov",
                        marks=(PROVENANCE_BEGIN, PROVENANCE_END), limits=PROVENANCE_LIMITS,
                        on_label="provenance record", cost_label="record's cost",
                        intro=intro)


def render_checkpoint(
    results: dict, titles: dict[str, str], rows_wanted: set[str], meta: dict
) -> str:
    """atoll (a checkpoint of the server side after each round) against atoll-nockpt (none),
    one run, and the checkpoint's size on disk per job."""
    intro = (
        f"Median of {meta['repeats']} repeats per cell (the repeats in brackets, in the order "
        "run); lower is better. Each repeat provisions and starts a fresh deployment (server and "
        "two sites as separate processes on 127.0.0.1, mutual TLS, the process launcher, "
        "workers under bubblewrap), the two variants alternating A B, B A, A B, … With the "
        "checkpoint: the server as `atoll provision` makes it: after each round the server "
        "worker writes the workflow's state (FedAvg: the global model and its bookkeeping) to "
        "`run/server/checkpoint/`, a temporary file, fsync, rename, fsync of the folder. "
        "Without: the server parent started with ATOLL_BENCHMARK_NO_CHECKPOINT=1 (for "
        "benchmarks only; its jobs cannot resume after a restart). CPU time and other load as "
        "in the sandbox table. The cost is the difference of the medians, in per cent of the "
        "time without; issue 37 allows at most +5 % for the tiny job and for the 100 MiB round.")
    sizes = ["", "The checkpoint on disk per job (its state file, the last round's, as the job's "
             "`checkpoint` events give it; `checkpoint.json` beside it is under 200 bytes; "
             "the folder is removed when the job ends):", "",
             f"| workload | {titles['atoll']} | {titles['atoll-nockpt']} |", "| --- | --- | --- |"]
    measured = {key.split("_")[0] for key in rows_wanted}
    for key, label in CHECKPOINT_SIZES:
        if key.split("_")[0] not in measured:
            continue
        row = []
        for system in ("atoll", "atoll-nockpt"):
            runs = results.get(system, [])
            values = [r[key] for r in runs if isinstance(r.get(key), int)]
            kept_none = bool(runs) and not values and any(f"{key.split('_')[0]}_round_s" in r
                                                          for r in runs)
            row.append(_bytes(statistics.median(values)) if values
                       else "none kept" if kept_none else "not run")
        sizes.append(f"| {label} | {row[0]} | {row[1]} |")
    return _render_cost(results, titles, rows_wanted, meta, off="atoll-nockpt",
                        marks=(CHECKPOINT_BEGIN, CHECKPOINT_END), limits=CHECKPOINT_LIMITS,
                        on_label="checkpoint per round", cost_label="checkpoint's cost",
                        intro=intro, extra=sizes)


def _bytes(value: float) -> str:
    """A size to the byte below 1 MiB (a tiny model's checkpoint), else in MiB or GiB."""
    return f"{value / 1024:.1f} KiB ({value:.0f} B)" if value < 2**20 else fmt(value, "B")


def _render_cost(
    results: dict, titles: dict[str, str], rows_wanted: set[str], meta: dict, *, off: str,
    marks: tuple[str, str], limits: dict[str, float], on_label: str, cost_label: str,
    intro: str | None = None, extra: list[str] | None = None,
) -> str:
    """atoll against one variant of it (``off``), one run: medians, repeats, the cost."""
    repeats = meta["repeats"]
    on = "atoll"
    lines = [
        marks[0],
        f"Measured {meta['date']} on this machine ({meta['machine']}), one run of:",
        "",
        f"    {meta['command']}",
        "",
        f"Median of {repeats} repeats per cell (the repeats in brackets, in the order run); "
        "lower is better. Each repeat provisions and starts a fresh deployment (server and two "
        "sites as separate processes on 127.0.0.1, mutual TLS, the process launcher), the two "
        "variants alternating A B, B A, A B, … Workloads and definitions as in the table with "
        "NVIDIA FLARE and Flower; the site script writes its marks into a folder the sites map "
        "as the study's dataset `marks`, in both variants. With the sandbox: the kits as `atoll provision` makes them "
        "(`process.sandbox: bwrap`, the default), so every job worker, the server's and each "
        "site's, runs under bubblewrap. Without: `process: {sandbox: none}` set in the "
        "server's and each site's local/site.yaml after provisioning (and the kits' record of "
        "their checked local/ made again, so both start alike). CPU time: user + system time "
        "of the server's and sites' parents and of every process below them (job workers, "
        "bwrap, helpers) from just before the submit until the job's workers were gone "
        "(drivers/atoll.py CpuSampler: the parents' own and reaped children's time, and what "
        "runs inside bwrap sampled at 20 Hz); it moves less than wall time with other load on "
        "the machine. Other load: the CPU the rest of the machine (other users' processes and "
        "this harness) used during the job, in cores of the machine's "
        f"{os.cpu_count()}, from /proc/stat. The cost is the "
        "difference of the medians, in per cent of the time without the sandbox; issue 19 "
        "allows at most +5 % for the tiny job and for the 1 GiB round." if intro is None
        else intro,
        "",
        f"| workload | {titles[on]} ({on_label}) | {titles[off]} | {cost_label} | limit |",
        "| --- | --- | --- | --- | --- |",
    ]
    measured = {key.split("_")[0] for key in rows_wanted}
    for key, label, unit in SANDBOX_ROWS:
        derived = key.endswith(("_cpu_s", "_others_cores"))
        if key not in rows_wanted and not (derived and key.split("_")[0] in measured):
            continue
        cells, medians = {}, {}
        for system in (on, off):
            values = [r[key] for r in results.get(system, []) if key in r]
            cells[system], medians[system] = cell(values, unit, repeats)
            numbers = [_short_value(v, unit) for v in values]
            if len(numbers) > 1:
                cells[system] += f" ({' / '.join(numbers)})"
        limit = limits.get(key)
        cost, verdict = "—", "—"
        if unit == "cores":  # not a cost: what else ran, for reading the rows above
            pass
        elif medians[on] and medians[off]:
            change = medians[on] / medians[off] - 1
            cost = f"{change * 100:+.1f} %"
            if unit == "B":
                cost += f" ({(medians[on] - medians[off]) / 2**20:+.0f} MiB)"
            elif unit == "cpu":
                cost += f" ({medians[on] - medians[off]:+.1f} CPU-s)"
            else:
                cost += f" ({medians[on] - medians[off]:+.2f} s)"
            if limit is not None:
                met = "met" if change <= limit else "**not met**"
                verdict = f"≤ +{limit * 100:.0f} %: {met}"
        elif limit is not None:
            verdict = f"≤ +{limit * 100:.0f} %"
        lines.append(f"| {label} | {cells[on]} | {cells[off]} | {cost} | {verdict} |")
    lines += [*(extra or []), "", marks[1]]
    return "\n".join(lines)


def _short_value(value, unit: str) -> str:
    if not isinstance(value, (int, float)):
        return "failed"
    if unit in ("cpu", "cores"):
        return f"{value:.1f}" if unit == "cpu" else f"{value:.2f}"
    return fmt(value, unit) if unit == "B" else f"{value:.2f}"


def write(
    path: Path, block: str, begin: str = BEGIN, end: str = END, heading: str = HEADING
) -> None:
    """Replace the text between begin and end; without them, append a section with heading."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + block + "\n"
    path.write_text(text if text.endswith("\n") else text + "\n")


def _short(reason: str, n: int = 60) -> str:
    reason = " ".join(reason.split()).replace("|", "/")
    return reason if len(reason) <= n else reason[: n - 1] + "…"
