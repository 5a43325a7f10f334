"""The model's path through atoll, hop by hop: bytes each hop moves through the kernel, the
memory it allocates, and its CPU time, for one model of a given size.

Each hop runs atoll's own code in this process, on real files (the handoff folder, the spill
files), in the order a FedAvg round takes it: site worker -> site parent -> (gRPC/TLS) -> server
parent -> server worker -> FedAvg -> back. The gRPC/TLS hop between the parents is not here (it
needs two parents; bench/compare/run.py times whole rounds with it).

Counts that do not depend on the machine's load:
- read / written: bytes through read and write system calls (/proc/self/io rchar, wchar), i.e.
  copies between this process and the page cache, per byte of the model;
- new memory: tracemalloc's peak while the hop runs (numpy reports its buffers to it): a hop
  that made a whole-model copy shows ~1.0 here;
- CPU: this process's CPU time for the hop (load moves it a little, not the counts).

  .venv/bin/python -m bench.compare.model_path --mib 100      # prints a Markdown table

tests/unit/wire/test_model_path_copies.py runs the same hops and fails on a whole-model copy.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl.aggregation import WeightedMean
from atoll.fl.model import Model
from atoll.fl.serde import encode, open_model
from atoll.server.spool import Budget, SpillFiles, Spool
from atoll.site.worker_backend import _as_file
from atoll.wire import frames
from atoll.wire.handoff import KEY, HandoffDir

LAYER_BYTES = 64 * 1024 * 1024  # the bench's model: float32 layers of at most 64 MiB


@dataclass
class Hop:
    name: str
    read: int  # bytes through read system calls
    written: int  # bytes through write system calls
    peak: int  # tracemalloc's peak, bytes
    cpu_s: float
    copies: str  # what the hop copies in user space, by construction (checked by the tests)


def _io() -> tuple[int, int]:
    values = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        key, _, value = line.partition(":")
        values[key] = int(value)
    return values["rchar"], values["wchar"]


def measure(name: str, copies: str, fn: Callable[[], Any]) -> tuple[Hop, Any]:
    """Run one hop; its counts, and what it returned."""
    tracemalloc.start()
    read0, written0 = _io()
    cpu0 = time.process_time()
    try:
        out = fn()
        cpu = time.process_time() - cpu0
        read1, written1 = _io()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return Hop(name, read1 - read0, written1 - written0, peak, cpu, copies), out


def model_of(nbytes: int, value: float = 0.0) -> dict[str, np.ndarray]:
    """float32 layers of at most LAYER_BYTES adding up to nbytes (a multiple of 4)."""
    params, left, i = {}, nbytes // 4, 0
    while left:
        n = min(left, LAYER_BYTES // 4)
        params[f"layer{i}"] = np.full(n, value, np.float32)
        left, i = left - n, i + 1
    return params


def _drain(stream: Iterator[Any]) -> int:
    return sum(len(x) for x in stream)


def run_path(nbytes: int, folder: Path, rounds: int = 2) -> list[Hop]:
    """The hops of the last of ``rounds`` rounds for a model of nbytes (one site's upload, the
    average, the download to two sites), in one job's folders: as in a job, the handoff files
    of a round are filled again in the next (the first round writes fresh pages)."""
    site_dir = folder / "site-handoff"
    server_dir = folder / "server-handoff"
    site_parent, site_worker = HandoffDir(site_dir, create=True), HandoffDir(site_dir)
    server_parent, server_worker = HandoffDir(server_dir, create=True), HandoffDir(server_dir)
    (folder / "job").mkdir()
    spill = SpillFiles(folder / "job")
    try:
        trained = model_of(nbytes, 1.0)  # the site's trained weights (its script's arrays)
        global_params = model_of(nbytes, 0.5)  # the server worker's global model
        for _ in range(rounds):
            hops, trained, global_params = _round(
                nbytes, trained, global_params, (site_parent, site_worker),
                (server_parent, server_worker), spill)
    finally:
        for handle in (site_parent, site_worker, server_parent, server_worker):
            handle.close()
        spill.close()
    return hops


def _round(nbytes: int, trained: dict[str, np.ndarray], global_params: dict[str, np.ndarray],
           site: tuple[HandoffDir, HandoffDir], server: tuple[HandoffDir, HandoffDir],
           spill: SpillFiles) -> tuple[list[Hop], dict[str, np.ndarray], dict[str, np.ndarray]]:
    hops: list[Hop] = []
    site_parent, site_worker = site
    server_parent, server_worker = server
    budget = Budget(4 * nbytes)

    hop, name = measure(
        "site worker: encode + write into the handoff file", "none (writev from the arrays)",
        lambda: site_worker.put(encode(Model(params=trained, num_examples=1))))
    hops.append(hop)

    # The site parent reads its worker's file frame by frame and hands each to gRPC, which
    # sends it and lets it go (dropped here). What gRPC delivers at the server is the same
    # frames: read aside, unmeasured, to feed the next hop.
    wire_frames = _frames_in(site_parent.path / name)
    hop, _ = measure(
        "site parent: read the worker's file (pread)", "none (each frame pread into its bytes)",
        lambda: _drain(site_parent.take(name)))
    hops.append(hop)

    # gRPC/TLS to the server parent, which writes the reply's frames, as they arrive, into
    # the file its worker will read.
    def reply_in(wire_frames: list[bytes]) -> str:
        spool = Spool(spill, ["workflow"], budget, live=False, own_file=server_parent.create())
        for raw in wire_frames:
            spool.append(frames.data_only(raw))
        spool.finish()
        return spool.hand_over()

    hop, name = measure("server parent: the reply into its worker's file", "none",
                        lambda: reply_in(wire_frames))
    hops.append(hop)

    mean = WeightedMean(global_params, reuse_reference=True)

    def fold() -> Model:
        stream = open_model(frames.Payload(server_worker.read(name)))
        header = mean.add_stream(stream)
        server_worker.give_back()
        return header

    hop, _ = measure("server worker: map the reply, FedAvg folds it in", "none (folded from "
                     "the mapped file into the global model's buffers)", fold)
    hops.append(hop)
    averaged = mean.result()

    hop, name = measure(
        "server worker: encode the mean + write the task file", "none (writev from the arrays)",
        lambda: server_worker.put(encode(Model(params=averaged, num_examples=0))))
    hops.append(hop)

    # The server parent reads the task file into its spool; both sites read it as it comes
    # (in lockstep here, as two sites keeping up do), so frames go once they are passed.
    def task_out() -> None:
        spool = Spool(spill, ["site-1", "site-2"], budget, live=True)
        readers = [spool.read("site-1"), spool.read("site-2")]
        for raw in server_parent.take(name):
            spool.append(raw)
            for reader in readers:
                assert next(reader) is raw  # what gRPC sends is the frame as read
        spool.finish()
        for reader in readers:
            assert next(reader, None) is None

    wire_frames = _frames_in(server_parent.path / name)
    hop, _ = measure("server parent: read the task file, relay it to both sites",
                     "none (each frame pread into its bytes, sent as it is)", task_out)
    hops.append(hop)

    # gRPC/TLS to the site parent, which writes the task's frames into its worker's file.
    head = frames.header({"task_id": "t1", "topic": "train", "headers": {"round": 1}})

    def task_in(wire_frames: list[bytes]) -> str:
        out = list(_as_file(iter([head, *wire_frames]), site_parent))
        return frames.read_header(out[-1])[KEY]

    hop, name = measure("site parent: the task into its worker's file", "none",
                        lambda: task_in(wire_frames))
    hops.append(hop)

    def decode() -> Model:
        model = open_model(frames.Payload(site_worker.read(name))).read(spare=trained)
        site_worker.give_back()
        return model

    hop, model = measure("site worker: map the task, decode into last round's arrays",
                         "one (the mapped file into the arrays)", decode)
    hops.append(hop)
    site_worker.give_back()
    return hops, model.params, averaged


def _frames_in(path: Path) -> list[bytes]:
    """The frames in a handoff file, as the next parent receives them from gRPC."""
    data, out, offset = memoryview(path.read_bytes()), [], 0
    while offset < len(data):
        length = frames.frame_size(data[offset : offset + 11])
        out.append(bytes(data[offset : offset + length]))
        offset += length
    return out


def table(hops: list[Hop], nbytes: int) -> str:
    rows = [
        "| hop | read syscalls, per model byte | written, per model byte | new memory, per "
        "model byte | CPU | user-space copies |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for hop in hops:
        rows.append(
            f"| {hop.name} | {hop.read / nbytes:.3f} | {hop.written / nbytes:.3f} | "
            f"{hop.peak / nbytes:.3f} | {hop.cpu_s:.3f} s | {hop.copies} |")
    read = sum(h.read for h in hops) / nbytes
    written = sum(h.written for h in hops) / nbytes
    rows.append(f"| **all hops but gRPC** | {read:.2f} | {written:.2f} | | "
                f"{sum(h.cpu_s for h in hops):.3f} s | |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=100, help="model size in MiB")
    args = parser.parse_args()
    from atoll.base.malloc_tuning import tune_for_streaming

    tune_for_streaming()  # as every parent and worker does
    nbytes = args.mib * 1024 * 1024
    with tempfile.TemporaryDirectory() as tmp:
        hops = run_path(nbytes, Path(tmp))
    print(f"A {args.mib} MiB model (float32 layers of at most 64 MiB), each hop in a job's "
          "second round:\n")
    print(table(hops, nbytes))


if __name__ == "__main__":
    main()
