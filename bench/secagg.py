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
    arrived, cpu = time.time(), time.process_time()
    params = {k: v + 1.0 for k, v in model.params.items()}
    del model
    fl.send(fl.Model(params=params, num_examples=1, metrics={"arrived": arrived, "cpu": cpu}))
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


def per_round(session: Session, folder: Path, scratch: Path) -> tuple[float, float]:
    """(wall seconds, a site worker's CPU seconds) per round, means over the sites."""
    job = session.submit(folder, wait=True, timeout=1800)
    if job["state"] != "FINISHED:COMPLETED":
        raise RuntimeError(f"benchmark job failed: {job['reason']} {job['parts']}")
    out = session.download(job["job_id"], scratch)
    rows = [json.loads(line) for line in (out / "results" / "metrics.jsonl").read_text()
            .splitlines()]
    stamps: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row["phase"] == "train" and row["site"] != "global":
            for key in ("arrived", "cpu"):
                stamps.setdefault((key, row["site"]), []).append(row["metrics"][key])

    def mean_gap(key: str) -> float:
        return statistics.mean(b - a for (k, _), times in stamps.items() if k == key
                               for a, b in zip(times, times[1:], strict=False))

    return mean_gap("arrived"), mean_gap("cpu")


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
                            wall, cpu = per_round(session, job, Path(tmp) / f"out{count}")
                            results.setdefault(key, []).append(wall)
                            results.setdefault(f"{key}|cpu", []).append(cpu)
                            print(f"{key}: {wall:.3f} s per round, site worker CPU {cpu:.3f} s",
                                  flush=True)
        finally:
            poc.down()
    return results


def table(results: dict[str, list[float]], command: str, repeats: int, rounds: int,
          big_elements: int) -> str:
    lines = [f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on this 2-core machine "
             f"(shared), median of {repeats} run(s) of {rounds} rounds each:", "",
             f"    {command}", "",
             "| model (2 sites) | per round | FedAvg | FedAvg + secure aggregation "
             "| overhead per round |", "| --- | --- | --- | --- | --- |"]
    for label in dict.fromkeys(k.split("|")[0] for k in results):
        for suffix, what in (("", "wall time"), ("|cpu", "one site worker's CPU time")):
            plain = statistics.median(results[f"{label}|plain{suffix}"])
            secure = statistics.median(results[f"{label}|secure{suffix}"])
            lines.append(f"| {label} | {what} | {plain:.3f} s | {secure:.3f} s | "
                         f"+{secure - plain:.3f} s ({secure / max(plain, 1e-9):.1f}×) |")
    lines += ["", "The secure round's own steps for the big model, timed in one process "
              "(CPU seconds; a site's steps once, the server's for two sites):", "",
              "| step | CPU time |", "| --- | --- |"]
    steps, sizes = component_times(big_elements)
    lines += [f"| {step} | {seconds:.3f} s |" for step, seconds in steps]
    lines += ["", f"A site's reply of the big model: {sizes[0] / 2**20:.1f} MiB of float32 plain, "
              f"{sizes[1] / 2**20:.1f} MiB of masked words (32-bit, the default "
              "privacy.secure_aggregation.word_bits)."]
    return "\n".join(lines)


def component_times(elements: int) -> tuple[list[tuple[str, float]], tuple[int, int]]:
    """CPU time of each step of a secure round on ``elements`` float32 values, two sites, and
    the bytes of the plain and the masked reply's arrays."""
    import numpy as np

    from atoll.fl.privacy.secagg import crypto, masking
    from atoll.fl.privacy.secagg.client import add_masks

    update = {"w": np.full(elements, 0.5, np.float32)}
    seeds = [(crypto.new_seed(), 1), (crypto.new_seed(), 1)]
    words = masking.encode(update, 10, 2)  # first touch of the buffers, not timed
    steps: list[tuple[str, float]] = []

    def timed(step: str, action) -> None:
        start = time.process_time()
        action()
        steps.append((step, time.process_time() - start))

    timed("site: encode the update in fixed point (buffers reused)",
          lambda: masking.encode(update, 10, 2, reuse=words))
    timed("site: add its self mask and one pairwise mask", lambda: add_masks(words, seeds))
    masked_bytes = sum(a.nbytes for a in words.values())
    total = {k: np.zeros_like(v) for k, v in words.items()}
    timed("server: fold two masked replies into the sum",
          lambda: [np.add(total[k], words[k], out=total[k]) for _ in range(2) for k in total])
    timed("server: remove two self masks", lambda: add_masks(total, seeds))
    timed("server: decode the sum", lambda: masking.decode(total))
    return steps, (update["w"].nbytes, masked_bytes)


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
    text = table(results, command, args.repeats, args.rounds, args.big_mb * 1024 * 1024 // 4)
    print(text)
    if not args.no_write:
        write_section(text, "secagg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
