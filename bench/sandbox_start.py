"""Worker start-up with and without the process launcher's sandbox (issue 19).

    .venv/bin/python -m bench.sandbox_start [--launches 30] [--no-write]

Starts a trivial worker (`python -c pass`) through the real ProcessLauncher, as a parent starts
a job's worker (its own run folder, a credentials pipe, CPU affinity, its log file), --launches
times with `process.sandbox: bwrap` and as many with `sandbox: none`, and times each from
launch() until wait() returned (the worker gone and its group reaped). `python -c pass` run
directly (subprocess, no launcher) is the reference. The three are interleaved, each round in
another order, after two launches of each that are not counted. Also timed, once per launcher:
the host probe a bwrap launcher makes before its first worker (where the worker's Python lives,
then one empty sandbox), which a parent pays on its first job.

Writes the table into BENCHMARKS.md between `<!-- sandbox-start:begin -->` and
`<!-- sandbox-start:end -->`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atoll.launchers.base import JobIdentity, Outcome
from atoll.launchers.process import ProcessLauncher
from atoll.launchers.request import build_request
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from bench.sections import write_section

ROOT = Path(__file__).resolve().parent.parent
SECTION = "sandbox-start"  # its markers in BENCHMARKS.md (bench/sections.py)
HEADING = "The process launcher's sandbox: worker start-up"
WARMUP = 2
PROBES = 5
LABELS = {
    "python": "`python -c pass` alone (subprocess, no launcher)",
    "none": "ProcessLauncher, `sandbox: none`: launch() → wait()",
    "bwrap": "ProcessLauncher, `sandbox: bwrap`: launch() → wait()",
}


def site_config(sandbox: str):
    return parse_site_config({"launcher": "process", "process": {"sandbox": sandbox}})


def make_launcher(sandbox: str) -> ProcessLauncher:
    # share_cpus=False: pin by this launcher's own count, not by other atoll parents on the host
    return ProcessLauncher(site_config(sandbox), share_cpus=False)


class Starter:
    """One launcher and a fresh run folder per worker, as a parent has per job."""

    def __init__(self, sandbox: str, base: Path, code: str):
        self.sandbox = sandbox
        self.config = site_config(sandbox)
        self.launcher = ProcessLauncher(self.config, share_cpus=False)
        self.base = base
        self.code = code
        self.count = 0
        self.meta = load_meta({"name": "start", "deploy_map": {"app": ["@ALL"]},
                               "resource_spec": {"@default": {"num_of_cpus": 1}}})

    def once(self) -> float:
        self.count += 1
        job_id = f"{self.sandbox}{self.count:06d}".ljust(32, "0")
        workdir = self.base / self.sandbox / job_id
        (workdir / "app").mkdir(parents=True)
        request = build_request(
            meta=self.meta,
            identity=JobIdentity(job_id, "start", "study", "site-a", "site"),
            site_config=self.config,
            study_runtime=None,
            workdir=workdir,
            parent_address="127.0.0.1:1",
            credentials={"ATOLL_JOB_TOKEN": "tok"},
            worker_args=("-c", self.code),
        )
        t0 = time.perf_counter()
        handle = self.launcher.launch(request)
        result = self.launcher.wait(handle)
        elapsed = time.perf_counter() - t0
        if result.outcome is not Outcome.COMPLETED:
            log = (workdir / "logs" / "worker.log").read_text(errors="replace")[-600:]
            raise SystemExit(f"sandbox_start: the {self.sandbox} worker failed: "
                             f"{result.reason}\n{log}")
        return elapsed


def python_alone(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/", stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def probe_once() -> float:
    """A fresh bwrap launcher's host probe, which its first launch() would make."""
    launcher = make_launcher("bwrap")
    t0 = time.perf_counter()
    launcher.sandbox_host()
    return time.perf_counter() - t0


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def measure(launches: int, code: str, log=print) -> dict:
    with tempfile.TemporaryDirectory(prefix="atoll-sandbox-start-") as tmp:
        base = Path(tmp)
        probes = []
        for _ in range(PROBES):
            probes.append(probe_once())
        starters = {s: Starter(s, base, code) for s in ("bwrap", "none")}
        starters["bwrap"].launcher.sandbox_host()  # its probe is timed above, not per worker
        runs = {
            "python": lambda: python_alone(code),
            "none": starters["none"].once,
            "bwrap": starters["bwrap"].once,
        }
        order = list(runs)
        for _ in range(WARMUP):
            for name in order:
                runs[name]()
        times: dict[str, list[float]] = {name: [] for name in order}
        for i in range(launches):
            turn = order[i % 3:] + order[:i % 3]  # each variant first, second, third in turn
            if i % 2:
                turn.reverse()
            for name in turn:
                times[name].append(runs[name]())
            if (i + 1) % 10 == 0:
                log(f"  {i + 1}/{launches}: " + ", ".join(
                    f"{n} {statistics.median(v) * 1000:.1f} ms" for n, v in times.items()))
    return {"times": times, "probe": probes}


def table(data: dict, launches: int, command: str, code: str) -> str:
    times, probes = data["times"], data["probe"]
    ms = 1000
    rows = []
    for name in ("python", "none", "bwrap"):
        rows.append(f"| {LABELS[name]} | {statistics.median(times[name]) * ms:.1f} ms | "
                    f"{p90(times[name]) * ms:.1f} ms |")
    paired = [b - n for b, n in zip(times["bwrap"], times["none"], strict=True)]
    rows.append(
        "| **the sandbox's overhead per worker** (bwrap − none) | "
        f"**{(statistics.median(times['bwrap']) - statistics.median(times['none'])) * ms:+.1f} "
        f"ms** | {(p90(times['bwrap']) - p90(times['none'])) * ms:+.1f} ms |")
    rows.append("| the launcher's own cost (none − python alone) | "
                f"{(statistics.median(times['none']) - statistics.median(times['python'])) * ms:+.1f}"
                f" ms | {(p90(times['none']) - p90(times['python'])) * ms:+.1f} ms |")
    rows.append(f"| host probe of a bwrap launcher, once per parent (before its first worker) "
                f"| {statistics.median(probes) * ms:.1f} ms | {p90(probes) * ms:.1f} ms |")
    worker = "`python -c pass`" if code == "pass" else f"`python -c {code!r}`"
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017
    lines = [
        f"Measured {date} on this machine ({os.cpu_count()} CPUs), one run of:",
        "",
        f"    {command}",
        "",
        f"A trivial worker ({worker}) started {launches} times each way through the real "
        "ProcessLauncher (a fresh run folder per worker, the credentials pipe, pinned to one "
        "CPU, its log file), timed from launch() until wait() returned; the three variants "
        "interleaved, in a changing order, after two uncounted starts of each. Median and 90th "
        "percentile (nearest rank) per row; the overhead rows are differences of those. The "
        "probe row: a fresh bwrap launcher's first sandbox_host() (the worker Python asked "
        f"where it lives, then one empty sandbox started), {len(probes)} times.",
        "",
        "| what | median | p90 |",
        "| --- | --- | --- |",
        *rows,
        "",
        f"Median of the {launches} paired differences (each round's bwrap start minus its none "
        f"start): {statistics.median(paired) * ms:+.1f} ms.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=30, help="counted starts per variant")
    parser.add_argument("--code", default="pass", help="the worker's `python -c` program")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.launches < 1:
        parser.error("--launches must be >= 1")
    data = measure(args.launches, args.code, log=lambda m: print(m, file=sys.stderr, flush=True))
    command = ".venv/bin/python -m bench.sandbox_start"
    if args.launches != 30:
        command += f" --launches {args.launches}"
    if args.code != "pass":
        command += f" --code {args.code!r}"
    text = table(data, args.launches, command, args.code)
    print(text)
    if not args.no_write:
        write_section(Path(args.output), SECTION, HEADING, text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
