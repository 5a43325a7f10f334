"""Where a FedAvg round's CPU goes, process by process, on a local federation.

    .venv/bin/python bench/round_cpu.py [--mib 100] [--rounds 6] [--workdir DIR]

Without --workdir its folder (a deployment and its jobs: GBs at 1 GiB) is removed once it
printed; with one, or after a failure, it is kept.

Starts bench/compare's atoll deployment (a server and two sites as separate processes on
127.0.0.1, mutual TLS, the process launcher, workers under bubblewrap), runs its FedAvg job (a
float32 model of ``--mib`` MiB made on the server, each site adds 1.0 and replies), and reads
every process of the deployment from /proc at 20 Hz. Between the first site's receipt of round
2's task and of the last round's (its script's marks), it prints each process's CPU time per
round, their sum, and the round's wall time: on two cores, a round whose processes need more
than twice its wall time in CPU cannot be made faster by reordering work, only by doing less.
Round 1 (the workers' start) and the last round's end are left out; a round starts when the
first site's script receives its task.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "compare"))

from drivers.atoll import AtollDriver  # noqa: E402
from drivers.base import read_marks  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _role(pid: str) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if " site start " in argv:
        return f"site parent ({argv.rstrip().rsplit('/', 1)[-1]})"
    if " server start " in argv:
        return "server parent"
    if "atoll.pki.verifier" in argv:
        return "signature verifier"
    if "-m atoll.worker" in argv:
        return f"worker ({_env(pid).get('ATOLL_SITE', '?')})"
    return None


def _env(pid: str) -> dict[str, str]:
    """A worker's environment, for its site's name (spec/worker_env.py's ATOLL_SITE)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def _cpu(pid: str) -> float | None:
    return _stat_cpu(f"/proc/{pid}/stat")


def _stat_cpu(path: str) -> float | None:
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def _threads(pid: str) -> dict[str, float]:
    """CPU seconds by thread name (comm; threads of one name summed) of one process."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        cpu = _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
        if cpu is not None:
            out[f"{name} [{tid}]"] = cpu
    return out


class Sampler:
    """{pid: (role, CPU seconds)} of the deployment's processes, every 50 ms, in a thread."""

    def __init__(self, threads: bool = False) -> None:
        self.threads = threads
        self.samples: list[tuple[float, dict[str, tuple[str, float]]]] = []
        self.thread_samples: list[tuple[float, dict[str, dict[str, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        roles: dict[str, str | None] = {}
        while not self._stop.is_set():
            snap = {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                if pid not in roles:
                    roles[pid] = _role(pid)
                cpu = _cpu(pid) if roles[pid] else None
                if cpu is not None:
                    snap[pid] = (roles[pid], cpu)
            now = time.time()
            self.samples.append((now, snap))
            if self.threads:
                self.thread_samples.append((now, {pid: _threads(pid) for pid in snap}))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def at(self, t: float) -> dict[str, tuple[str, float]]:
        return min(self.samples, key=lambda s: abs(s[0] - t))[1]

    def threads_at(self, t: float) -> dict[str, dict[str, float]]:
        return min(self.thread_samples, key=lambda s: abs(s[0] - t))[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=100.0, help="the model's size (float32)")
    ap.add_argument("--rounds", type=int, default=6, help="at least 4")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--threads", action="store_true",
                    help="also each process's CPU by thread (gRPC's pollers, executors, ...)")
    args = ap.parse_args()
    if args.rounds < 4:
        ap.error("--rounds must be at least 4: rounds 2 to the last are measured")
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="atoll-round-cpu-"))).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    driver = AtollDriver(work, "round-cpu", log=lambda *a: None)
    driver.prepare()
    watcher = driver.watcher("ready")
    driver.start_deployment()
    try:
        driver.wait_ready(watcher, 60)
        watcher.drop()
        time.sleep(1.5)
        marks = work / "marks"
        marks.mkdir()
        job = driver.prepare_job(args.mib, args.rounds, marks)
        sampler = Sampler(args.threads)
        run = driver.submit(job)
        driver.wait_finished(run, 600)
        sampler.stop()
    finally:
        driver.stop_deployment()
    received = [t for _, t in sorted(read_marks(marks).items())]  # each round's first receipt
    if len(received) < 3:
        sys.exit(f"the job left {len(received)} round marks; see {work}")
    first, last, rounds = received[1], received[-1], len(received) - 2
    before, after = sampler.at(first), sampler.at(last)
    print(f"{args.mib:g} MiB, rounds 2-{rounds + 1} of {args.rounds}: "
          f"{(last - first) / rounds:.3f} s a round (wall)")
    total = 0.0
    for pid, (role, cpu) in sorted(after.items(), key=lambda item: item[1][0]):
        used = cpu - before[pid][1] if pid in before else cpu
        if used >= 0.005 * rounds:
            print(f"  {role:32} {1000 * used / rounds:6.0f} CPU-ms a round")
            total += used
            if args.threads:
                _print_threads(sampler.threads_at(first).get(pid, {}),
                               sampler.threads_at(last).get(pid, {}), rounds)
    print(f"  {'all':32} {1000 * total / rounds:6.0f} CPU-ms a round, "
          f"{total / (last - first):.2f} cores on average")
    if args.workdir is None:  # a run that failed keeps its folder, to be read
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _print_threads(before: dict[str, float], after: dict[str, float], rounds: int) -> None:
    for name, cpu in sorted(after.items(), key=lambda kv: -(kv[1] - before.get(kv[0], 0.0))):
        used = cpu - before.get(name, 0.0)
        if used >= 0.002 * rounds:
            print(f"      {name:30} {1000 * used / rounds:6.0f}")


if __name__ == "__main__":
    sys.exit(main())
