#!/usr/bin/env python3
"""Runs the same workloads on NVIDIA FLARE 2.9, Flower 1.42 and atoll, and writes the table.

Standard library only: run it with any python3. The peers run from their own virtual
environments (bench/compare/setup_peers.sh makes them); nothing is installed into atoll's.

  python3 bench/compare/run.py                        # all systems, all workloads, 3 repeats
  python3 bench/compare/run.py --systems flare,flower --workloads a,c,d,e,f,b100 --repeats 3
  python3 bench/compare/run.py --systems atoll --merge-from bench/compare/last_run.json
      # debugging only: one system measured now, the others' columns copied from an earlier
      # run; writes bench/compare/merged_run.json and prints the table, BENCHMARKS.md untouched
  python3 bench/compare/run.py --systems atoll,atoll-unconfined --workloads a,b1000 --repeats 3
      # the sandbox's cost (issue 19): atoll with its workers under bwrap and with
      # `process: {sandbox: none}`, side by side; writes the sandbox-cost table of BENCHMARKS.md
      # and bench/compare/sandbox_run.json (the peer table only when a peer ran too)
  python3 bench/compare/run.py --systems atoll,atoll-hostnet --workloads a,b100 --repeats 3
      # the network sandbox's cost (issue 32): workers in their own network namespaces and
      # with `process: {network: host}`; its own table and bench/compare/network_run.json
  python3 bench/compare/run.py --systems atoll,atoll-noprov --workloads a,b100 --repeats 3
      # the provenance record's cost (issue 38): parents with and without it
      # (ATOLL_BENCHMARK_NO_PROVENANCE=1); its own table and bench/compare/provenance_run.json
  python3 bench/compare/run.py --systems atoll,atoll-nockpt --workloads a,b100 --repeats 3
      # the per-round checkpoint's cost (issue 37): the server with and without it
      # (ATOLL_BENCHMARK_NO_CHECKPOINT=1), and its size on disk per job; its own table and
      # bench/compare/checkpoint_run.json

Workloads (issue 9): a = 2 clients x 3 rounds of FedAvg on a 4 KiB model, submit -> finished
and per-round time; b100 / b1000 (or b for both) = the same with a 100 MiB / 1 GiB model,
per-round time and peak RSS summed over every process; c = idle RSS of server + 2 clients;
d = start -> ready; e = abort -> every job process gone; f = one "list jobs" CLI command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
import workloads  # noqa: E402
from drivers.atoll import (  # noqa: E402
    AtollDriver,
    AtollHostNetDriver,
    AtollNoCheckpointDriver,
    AtollNoProvenanceDriver,
    AtollUnconfinedDriver,
)
from drivers.base import REPO  # noqa: E402
from drivers.flare import FlareDriver  # noqa: E402
from drivers.flower import FlowerDriver  # noqa: E402

DRIVERS = {
    "flare": FlareDriver,
    "flower": FlowerDriver,
    "atoll": AtollDriver,
    "atoll-unconfined": AtollUnconfinedDriver,  # atoll, workers without the sandbox (issue 19)
    "atoll-hostnet": AtollHostNetDriver,  # atoll, workers on the host's network (issue 32)
    "atoll-noprov": AtollNoProvenanceDriver,  # atoll, no provenance record (issue 38)
    "atoll-nockpt": AtollNoCheckpointDriver,  # atoll, no per-round checkpoint (issue 37)
}

NOTES = [
    "How each system runs here: FLARE 2.9.0 in POC mode (`nvflare poc prepare/start`, mutual "
    "TLS as POC provisions it), its FedAvg recipe (in-time aggregation) with a numpy Client API "
    "script run in the client job process; Flower 1.42.0 as `flower-superlink` + 2 "
    "`flower-supernode` over TLS (server-authenticated: Flower has no mutual TLS; SuperNode "
    "key auth off), its FedAvg strategy in a ServerApp and a numpy ClientApp; atoll with mutual "
    "TLS and the process launcher, its FedAvg workflow (aggregation as results arrive, no "
    "validation) and a numpy client API script, its server worker making the model in place "
    "(app.yaml `initial_model: model.py:make`) as FLARE's persistor and Flower's ServerApp do. "
    "Jobs are submitted, listed and aborted with each system's "
    "own CLI (`nvflare job …`, `flwr run|ls|stop`, `atoll job …`), timed from the start of the "
    "command; readiness and completion are watched with each system's own API (polled every 0.1 s; "
    "atoll's job followed as `atoll job submit --wait` does, the server answering each change, "
    "since 2026-12-06), by a "
    "poller started (interpreter, imports and, for a job, its connection) before the clock "
    "starts (since 2026-12-06; before, it started after the deployment or the submit, on the "
    "same cores).",
    "",
    "Definitions: the model is float32 layers of at most 64 MiB made in place on the server, "
    "each client adds 1.0 and replies, nobody writes the model to disk. Per-round time = mean "
    "interval between consecutive rounds' arrival of the model at the first client. RSS = sum "
    "over every process of the deployment (parents, job processes; not the admin CLI), read "
    "from /proc at 20 Hz; idle = median over 3 s, 5 s after ready. Start → ready = from "
    "the start of the first parent's command until the poller's answer in which the server "
    "lists both clients (the poller's clock, as for a job's end; until 2026-12-06 the poller's "
    "exit after it was counted too). Abort = from the abort command until no job process is "
    "left. List = the second of two back-to-back CLI calls.",
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--systems",
        default="flare,flower,atoll",
        help="comma-separated: flare, flower, atoll, atoll-unconfined, atoll-hostnet, "
        "atoll-noprov, atoll-nockpt (default: "
        "flare, flower, atoll); atoll-hostnet = atoll with `process: {network: host}`, whose "
        "comparison with atoll goes to a table of its own (the network sandbox's cost); "
        "atoll-unconfined = atoll with `process: {sandbox: none}`, whose "
        "comparison with atoll goes to its own table; atoll-noprov = atoll keeping no "
        "provenance record (its own table too); atoll-nockpt = atoll keeping no per-round "
        "checkpoint (its own table, with the checkpoint's size on disk)",
    )
    p.add_argument(
        "--workloads",
        default="a,b,c,d,e,f",
        help="comma-separated: a, b (= b100,b1000), b100, b1000, c, d, e, f; b4000 (4 GiB, "
        "float32); llm1, llm4, llm8 "
        "(issue 40: a bf16 model shaped like a language model, 1/4/8 GiB; peers that have no "
        "bf16 get float32 tensors of the same byte sizes)",
    )
    p.add_argument("--repeats", type=int, default=3, help="repeats per system (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="FL rounds for (a) and (b)")
    p.add_argument(
        "--rss-limit-gb",
        type=float,
        default=16.0,
        help="stop a deployment whose summed RSS passes this (default 16)",
    )
    p.add_argument(
        "--workdir",
        default="/tmp/atoll-bench-compare",
        help="where deployments are provisioned (default /tmp/atoll-bench-compare)",
    )
    p.add_argument(
        "--output",
        default=None,
        help="Markdown file to update between the compare markers (default: BENCHMARKS.md; "
        "none with --merge-from)",
    )
    p.add_argument(
        "--json",
        default=None,
        help="where to write every raw measurement (default: bench/compare/last_run.json; "
        "bench/compare/merged_run.json with --merge-from)",
    )
    p.add_argument("--cpu", action="store_true",
                   help="measure each atoll job's CPU time, all processes (steadier than wall "
                        "time on a loaded machine; in the log and the JSON)")
    p.add_argument("--no-write", action="store_true", help="print the table, write no file")
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep every deployment's folder (default: removed after a cycle that measured "
        "everything; a failed cycle's folder is always kept, logs included)",
    )
    p.add_argument(
        "--merge-from",
        default=None,
        help="debugging only: take the systems not in --systems from this earlier run's JSON "
        "(the table says so); the official table comes from one run of all three systems",
    )
    args = p.parse_args(argv)
    merging = args.merge_from is not None
    args.systems = _split(args.systems, list(DRIVERS), "--systems")
    args.sandbox_cost = "atoll-unconfined" in args.systems
    args.network_cost = "atoll-hostnet" in args.systems
    args.provenance_cost = "atoll-noprov" in args.systems
    args.checkpoint_cost = "atoll-nockpt" in args.systems
    variant = (args.sandbox_cost or args.network_cost or args.provenance_cost
               or args.checkpoint_cost)
    # the peer table (and last_run.json, which --merge-from reads) only from a run with a peer
    args.peer_table = not variant or any(s in report.PEERS for s in args.systems)
    if variant and merging:
        p.error("--merge-from is for the peer table; it does not go with atoll-unconfined "
                "or atoll-hostnet")
    if args.json is None:
        name = "merged_run.json" if merging else "last_run.json"
        if not args.peer_table:
            name = ("sandbox_run.json" if args.sandbox_cost else "network_run.json"
                    if args.network_cost else "provenance_run.json" if args.provenance_cost
                    else "checkpoint_run.json")
        args.json = str(REPO / "bench" / "compare" / name)
    if args.output is None and not merging:
        args.output = str(REPO / "BENCHMARKS.md")
    wl = [
        w
        for item in _split(
            args.workloads, ["a", "b", "b100", "b1000", "b4000", "c", "d", "e", "f", *workloads.LLM],
            "--workloads"
        )
        for w in (["b100", "b1000"] if item == "b" else [item])
    ]
    args.workloads = [w for w in workloads.ALL if w in wl]
    if args.repeats < 1 or args.rounds < 2:
        p.error("--repeats must be >= 1 and --rounds >= 2 (per-round time needs two rounds)")
    return args


def _split(value: str, allowed: list[str], flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        sys.exit(
            f"run.py: {flag} takes a comma-separated list of {', '.join(allowed)}; got {value!r}"
        )
    return items


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> str:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    return f"{os.cpu_count()} CPUs, {mem / 2**30:.0f} GiB memory"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # a SIGTERM unwinds like Ctrl-C, so every deployment's cleanup still runs
    signal.signal(signal.SIGTERM, _interrupt)
    opts = workloads.Options(rounds=args.rounds, rss_limit_bytes=int(args.rss_limit_gb * 2**30))
    token = uuid.uuid4().hex[:10]
    root = Path(args.workdir) / token
    results: dict[str, list[dict]] = {s: [] for s in args.systems}
    titles = {name: cls.title for name, cls in DRIVERS.items()}
    skipped: dict[str, str] = {}
    for system in args.systems:
        reason = DRIVERS[system](root / system, token, log).missing()
        if reason:
            skipped[system] = reason
            log(f"{system}: skipped: {reason}")
    active = [s for s in args.systems if s not in skipped]
    if args.cpu or variant_run(args):  # each job's CPU time: steadier
        AtollDriver.measure_cpu = True
    log(f"systems {active}, workloads {args.workloads}, {args.repeats} repeats, work in {root}")
    try:
        for r in range(1, args.repeats + 1):
            for system in _order(active, r, variant_run(args)):
                driver = DRIVERS[system](root / f"{system}-r{r}", f"{token}-{system}-{r}", log)
                driver.workdir.mkdir(parents=True, exist_ok=True)
                log(f"{system} repeat {r}/{args.repeats}")
                metrics = workloads.run_cycle(driver, args.workloads, opts)
                results[system].append(metrics)
                failed = any(str(v).startswith("failed") for v in metrics.values())
                if not (args.keep_work or failed):
                    # 1 GiB models, checkpoints and spill files pile up to tens of GB over a
                    # run: the page cache fills, and every later deployment pays for it
                    shutil.rmtree(driver.workdir, ignore_errors=True)
                log(
                    f"{system} repeat {r}: "
                    + ", ".join(f"{k}={_show(v)}" for k, v in metrics.items())
                )
    except KeyboardInterrupt:
        log("interrupted: every started deployment has been stopped; writing what was measured")
    command = "python3 bench/compare/run.py " + " ".join(shlex.quote(a) for a in argv)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),  # noqa: UP017 (any python3)
        "machine": machine(),
        "command": command.strip(),
        "repeats": args.repeats,
        "notes": NOTES
        + ([""] + [f"{titles[s]} not run: {why}" for s, why in skipped.items()] if skipped else []),
    }
    rows = set(workloads.metric_keys(args.workloads))
    if args.merge_from:
        results, rows = _merge(Path(args.merge_from), results, rows, meta, titles)
    blocks = []  # (block, begin, end, heading)
    if args.peer_table:
        blocks.append((report.render(results, titles, rows, meta), report.BEGIN, report.END,
                       report.HEADING))
    if args.sandbox_cost:
        blocks.append((report.render_sandbox(results, titles, rows, meta),
                       report.SANDBOX_BEGIN, report.SANDBOX_END, report.SANDBOX_HEADING))
    if args.network_cost:
        blocks.append((report.render_network(results, titles, rows, meta),
                       report.NETWORK_BEGIN, report.NETWORK_END, report.NETWORK_HEADING))
    if args.provenance_cost:
        blocks.append((report.render_provenance(results, titles, rows, meta),
                       report.PROVENANCE_BEGIN, report.PROVENANCE_END,
                       report.PROVENANCE_HEADING))
    if args.checkpoint_cost:
        blocks.append((report.render_checkpoint(results, titles, rows, meta),
                       report.CHECKPOINT_BEGIN, report.CHECKPOINT_END,
                       report.CHECKPOINT_HEADING))
    for block, *_ in blocks:
        print(block)
    if not args.no_write:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        written = [args.json]
        if args.output:
            for block, begin, end, heading in blocks:
                report.write(Path(args.output), block, begin, end, heading)
            written.insert(0, args.output)
        log(f"wrote {' and '.join(written)}")
    return 0


def variant_run(args: argparse.Namespace) -> bool:
    """atoll against one variant of itself: CPU measured, the pair alternating."""
    return bool(args.sandbox_cost or args.network_cost or args.provenance_cost
                or args.checkpoint_cost)


def _order(active: list[str], repeat: int, sandbox_cost: bool) -> list[str]:
    """The systems' cycles of one repeat. For the sandbox's cost, the pair atoll /
    atoll-unconfined runs A B, B A, A B, ... so that neither side always runs first after the
    other (a machine that drifts through a run weighs both alike); otherwise the given order."""
    if sandbox_cost and repeat % 2 == 0:
        return list(reversed(active))
    return active


def _merge(path: Path, results: dict, rows: set[str], meta: dict, titles: dict):
    """Add the systems this run did not measure from an earlier run's JSON (debugging only)."""
    earlier = json.loads(path.read_text())
    taken = [s for s in earlier["results"] if s not in results]
    merged = dict(results)
    for system in taken:
        merged[system] = earlier["results"][system]
        for run in merged[system]:
            rows |= {k for k in run if k in report.KEYS}
    if taken:
        meta["notes"] = [
            f"MERGED, for debugging only: {', '.join(titles[s] for s in taken)} from "
            f"{path.name} (measured {earlier['meta']['date']} by `{earlier['meta']['command']}`), "
            "not from this run; ratios across runs are not comparable.",
            "",
            *meta["notes"],
        ]
    return merged, rows


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _show(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int) and v > 2**20:
        return f"{v / 2**20:.0f}MiB"
    return str(v)[:120]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
