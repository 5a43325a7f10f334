"""What the server worker's per-round checkpoint costs, its state file written past the page
cache (O_DIRECT, the default where the filesystem allows) or through it.

    .venv/bin/python bench/checkpoint_write.py [--mib 100] [--rounds 6] [--gap 0.7]
        [--folder DIR]

Saves a FedAvg-shaped state (a float32 model of ``--mib`` MiB, named as the round's model, so
its SHA-256 comes from the write's own pass) with ``atoll.fl.checkpoint.save`` once a round,
``--gap`` seconds apart (a round's length: pages not touched for a while cost more to touch
again on these VMs), in both ways, interleaved round by round in two folders. Prints each way's
CPU time (this process: the write, the digest, fsync, the old file's removal) and wall time per
save, rounds 3 onwards.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from atoll.fl import checkpoint
from atoll.fl.model import Model


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--gap", type=float, default=0.7)
    ap.add_argument("--folder", type=Path, default=None)
    args = ap.parse_args()
    floats = args.mib * 1024 * 1024 // 4 // 4
    rng = np.random.default_rng(0)
    params = {f"layer{i}": rng.random(floats, dtype=np.float32) for i in range(4)}
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.folder))
    ways = {"O_DIRECT": (root / "direct", True), "page cache": (root / "cached", False)}
    seen: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    for round_ in range(1, args.rounds + 1):
        for way, (folder, direct) in ways.items():
            for array in params.values():
                array += 1.0  # each round's model is new
            checkpoint.DIRECT = direct
            state = {"global": params, "rounds_done": round_}
            cpu, wall = _cpu(), time.perf_counter()
            checkpoint.save(folder, round_, state, Model(params=params, round=round_))
            seen[way].append((_cpu() - cpu, time.perf_counter() - wall))
            time.sleep(args.gap)
    print(f"checkpoint of a {args.mib} MiB model, rounds 3-{args.rounds}, median "
          f"(each round's in brackets):")
    for way, rows in seen.items():
        kept = rows[2:]
        cpu = statistics.median(c for c, _ in kept)
        wall = statistics.median(w for _, w in kept)
        each = " / ".join(f"{c * 1000:.0f}" for c, _ in kept)
        print(f"  {way:>12}: {cpu * 1000:.0f} CPU-ms ({each}), {wall * 1000:.0f} ms wall")
    for folder, _ in ways.values():
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    root.rmdir()


if __name__ == "__main__":
    main()
