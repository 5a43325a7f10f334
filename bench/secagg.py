"""Secure aggregation's cost per round: the same FedAvg job with and without it.

Two sites (`atoll poc up --sites 2`: a server and two site parents, mutual TLS, the process
launcher), a float32 model made in place on the server (tiny: 4 KiB; big: 100 MiB by default),
each site adds 1.0 and replies, no evaluation. Per-round time = the mean interval between
consecutive rounds' arrival of the train task at a site (its script stamps the time into its
metrics), skipping nothing but the first arrival. Plain and secure jobs alternate, so drift
hits both. Writes the `secagg` block of BENCHMARKS.md unless --no-write.

    .venv/bin/python -m bench.secagg [--repeats 2] [--rounds 4] [--big-mb 100]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from atoll.admin.session import Session
from bench.federation import Poc, write_section

TRAIN = '''
import time
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    arrived = time.time()
    params = {k: v + 1.0 for k, v in model.params.items()}
    del model
    fl.send(fl.Model(params=params, num_examples=1, metrics={"arrived": arrived}))
'''
MODEL = '''
import numpy as np

def make():
    size = {elements}
    layer = 16 * 1024 * 1024  # 64 MiB per layer at most, as the compare benchmark does
    return {{f"layer{{i}}": np.zeros(min(layer, size - i * layer), np.float32)
             for i in range((size + layer - 1) // layer)}}
'''


def make_job(folder: Path, elements: int, rounds: int, secure: bool) -> Path:
    (folder / "app").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(
        {"name": folder.name, "deploy_map": {"app": ["@ALL"]}}))
    privacy = "privacy:\n  secure_aggregation: {}\n" if secure else ""
    (folder / "app" / "app.yaml").write_text(
        f"server:\n  workflow: fedavg\n  args: {{num_rounds: {rounds}, round_timeout: 600, "
        "evaluate_every: 0, cross_site_eval: none}\n  initial_model: model.py:make\n"
        f"site:\n  script: train.py\n{privacy}")
    (folder / "app" / "train.py").write_text(TRAIN)
    (folder / "app" / "model.py").write_text(MODEL.format(elements=elements))
    return folder


def per_round(session: Session, folder: Path, scratch: Path) -> float:
    job = session.submit(folder, wait=True, timeout=1800)
    if job["state"] != "FINISHED:COMPLETED":
        raise RuntimeError(f"benchmark job failed: {job['reason']} {job['parts']}")
    out = session.download(job["job_id"], scratch)
    rows = [json.loads(line) for line in (out / "results" / "metrics.jsonl").read_text()
            .splitlines()]
    arrivals: dict[str, list[float]] = {}
    for row in rows:
        if row["phase"] == "train" and row["site"] != "global":
            arrivals.setdefault(row["site"], []).append(row["metrics"]["arrived"])
    gaps = [b - a for times in arrivals.values() for a, b in zip(times, times[1:], strict=False)]
    return statistics.mean(gaps)


def measure(repeats: int, rounds: int, big_mb: int) -> dict[str, list[float]]:
    sizes = {"tiny (4 KiB)": 1024, f"{big_mb} MiB": big_mb * 1024 * 1024 // 4}
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="atoll-bench-secagg-") as tmp:
        poc = Poc(Path(tmp) / "poc")
        poc.up()
        try:
            with Session(poc.kit("admin@poc.local")) as session:
                while not all(s["online"] for s in session.sites()["sites"]):
                    time.sleep(0.05)
                count = 0
                for _ in range(repeats):
                    for label, elements in sizes.items():
                        for secure in (False, True):
                            count += 1
                            job = make_job(Path(tmp) / f"job{count}", elements, rounds, secure)
                            key = f"{label}|{'secure' if secure else 'plain'}"
                            value = per_round(session, job, Path(tmp) / f"out{count}")
                            results.setdefault(key, []).append(value)
                            print(f"{key}: {value:.3f} s per round", flush=True)
        finally:
            poc.down()
    return results


def table(results: dict[str, list[float]], command: str, repeats: int, rounds: int) -> str:
    lines = [f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on this 2-core machine "
             f"(shared), median of {repeats} run(s) of {rounds} rounds each:", "",
             f"    {command}", "",
             "| model (2 sites) | FedAvg, per round | FedAvg + secure aggregation, per round "
             "| overhead per round |", "| --- | --- | --- | --- |"]
    for label in dict.fromkeys(k.split("|")[0] for k in results):
        plain = statistics.median(results[f"{label}|plain"])
        secure = statistics.median(results[f"{label}|secure"])
        lines.append(f"| {label} | {plain:.3f} s | {secure:.3f} s | "
                     f"+{secure - plain:.3f} s ({secure / plain:.1f}×) |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--big-mb", type=int, default=100)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    results = measure(args.repeats, args.rounds, args.big_mb)
    command = ("make bench-secagg" if (args.repeats, args.rounds, args.big_mb) == (2, 4, 100)
               else f".venv/bin/python -m bench.secagg --repeats {args.repeats} "
                    f"--rounds {args.rounds} --big-mb {args.big_mb}")
    text = table(results, command, args.repeats, args.rounds)
    print(text)
    if not args.no_write:
        write_section(text, "secagg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
