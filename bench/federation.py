"""Federation benchmark (issue 3): a local federation with mutual TLS on this machine.

    .venv/bin/python -m bench.federation [--repeats 3] [--big-mb 100]

Measures, each as the median of --repeats runs: federation ready time (`atoll poc up`, two
sites), submit until every worker runs, time per round with a 1 KB payload (the federation's
own overhead: the sites echo at once) and a 100 MB payload, as the workflow itself times a round
(send until every reply is in, rounds after the first), abort until every
worker process is gone, idle RSS of each parent, one CLI command's latency, and the growth of the
parents' RSS during a 100 MB round trip. Writes the table into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from atoll.admin.session import Session

ROOT = Path(__file__).resolve().parent.parent
ATOLL = [sys.executable, "-m", "atoll"]
STALL = ("import time\nimport atoll.client as fl\nfl.init()\nfl.receive()\n"
         "time.sleep(3600)\n")
ECHO = ("import atoll.client as fl\nfl.init()\nwhile fl.is_running():\n"
        "    m = fl.receive()\n    if m is None:\n        break\n"
        "    fl.send(fl.Model(params=m.params, num_examples=1))\n")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def job_pids(job_id: str) -> list[int]:
    marker = f"ATOLL_JOB_ID={job_id}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def make_job(folder: Path, script: str, rounds: int = 1, payload: int = 1024) -> Path:
    (folder / "app").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(
        {"name": folder.name, "deploy_map": {"app": ["@ALL"]}}))
    (folder / "app" / "app.yaml").write_text(
        f"server:\n  workflow: scatter_gather\n  args: {{num_rounds: {rounds}, "
        f"payload_bytes: {payload}, round_timeout: 600}}\nsite:\n  script: train.py\n")
    (folder / "app" / "train.py").write_text(script)
    return folder


class Poc:
    def __init__(self, workspace: Path):
        self.workspace = workspace
        self.env = {**os.environ, "ATOLL_HOME": str(workspace / "home")}

    def up(self) -> float:
        start = time.perf_counter()
        subprocess.run([*ATOLL, "poc", "up", "--sites", "2", "--workspace", str(self.workspace)],
                       check=True, env=self.env, capture_output=True)
        return time.perf_counter() - start

    def down(self) -> None:
        subprocess.run([*ATOLL, "poc", "down", "--workspace", str(self.workspace)],
                       check=True, env=self.env, capture_output=True)

    def kit(self, name: str) -> Path:
        return self.workspace / "poc" / name

    def parent_pids(self) -> dict[str, int]:
        out = {}
        for name, role in [("server", "server"), ("site-1", "site"), ("site-2", "site")]:
            data = json.loads((self.kit(name) / "workspace" / f"{role}.pid").read_text())
            out[name] = int(data["pid"])
        return out


class RssPeak:
    """Samples the parents' RSS at 20 Hz while a block runs."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.base = {name: rss_mib(pid) for name, pid in pids.items()}
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mib(pid))

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def growth(self) -> float:
        return max(self.peak[n] - self.base[n] for n in self.pids)


def round_seconds(session: Session, folder: Path, scratch: Path) -> list[float]:
    """Run a scatter_gather job; the workflow's own time per round (send until every reply
    is in), skipping the first round (it also pays for the sites' first task pull)."""
    job = session.submit(folder, wait=True, timeout=900)
    if job["state"] != "FINISHED:COMPLETED":
        raise RuntimeError(f"benchmark job failed: {job['reason']} {job['parts']}")
    out = session.download(job["job_id"], scratch)
    rounds = json.loads((out / "results" / "scatter_gather.json").read_text())["rounds"]
    return [r["seconds"] for r in rounds[1:]]


def measure(repeats: int, big_mb: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)
        print(f"  {key}: {value:.4g}", flush=True)

    for run in range(repeats):
        print(f"run {run + 1}/{repeats}", flush=True)
        with tempfile.TemporaryDirectory(prefix="atoll-bench-") as tmp:
            tmp = Path(tmp)
            poc = Poc(tmp / "ws")
            add("ready_s", poc.up())
            try:
                pids = poc.parent_pids()
                time.sleep(1.0)
                add("idle_rss_server_mib", rss_mib(pids["server"]))
                add("idle_rss_site_mib", max(rss_mib(pids["site-1"]), rss_mib(pids["site-2"])))
                cli = []
                for _ in range(5):
                    start = time.perf_counter()
                    subprocess.run([*ATOLL, "job", "list", "--kit", str(poc.kit("admin@poc.local"))],
                                   check=True, env=poc.env, capture_output=True)
                    cli.append(time.perf_counter() - start)
                add("cli_job_list_s", statistics.median(cli))
                with Session(poc.kit("admin@poc.local")) as s:
                    start = time.perf_counter()
                    job_id = s.submit(make_job(tmp / "stall", STALL))["job_id"]
                    while not all(p["state"] == "RUNNING" for p in s.status(job_id)["parts"].values()):
                        time.sleep(0.005)
                    add("submit_to_all_running_s", time.perf_counter() - start)
                    start = time.perf_counter()
                    s.abort(job_id)
                    while job_pids(job_id):
                        time.sleep(0.002)
                    add("abort_to_workers_gone_s", time.perf_counter() - start)
                    s.wait(job_id, timeout=60)
                    add("round_overhead_1kb_s", statistics.median(
                        round_seconds(s, make_job(tmp / "r12", ECHO, rounds=12), tmp / "dl")))
                    big = big_mb * 1024 * 1024
                    with RssPeak(pids) as peak:
                        seconds = round_seconds(
                            s, make_job(tmp / "b4", ECHO, rounds=4, payload=big), tmp / "dl")
                    add("parent_rss_growth_mib", peak.growth())
                    add(f"round_{big_mb}mb_s", statistics.median(seconds))
            finally:
                poc.down()
    return results


ROWS = [
    ("ready_s", "local federation ready (`poc up`, 2 sites)", "s", "<= 1.5 s", "10-14 s"),
    ("submit_to_all_running_s", "submit until every worker runs", "s", "", ""),
    ("round_overhead_1kb_s", "per-round overhead, 1 KB payload", "s", "<= 0.05 s", "2.5 s"),
    ("round_{mb}mb_s", "seconds per round, {mb} MB payload, 2 sites", "s", "", ""),
    ("abort_to_workers_gone_s", "abort until every worker is gone", "s", "<= 0.5 s", "7 s"),
    ("idle_rss_server_mib", "idle RSS, server parent", "MiB", "<= 40 MiB", "85-93 MiB"),
    ("idle_rss_site_mib", "idle RSS, site parent", "MiB", "<= 40 MiB", "85-93 MiB"),
    ("cli_job_list_s", "one CLI command (`atoll job list`)", "s", "<= 0.3 s", "1.95 s"),
    ("parent_rss_growth_mib", "parents' RSS growth during {mb} MB round trips", "MiB", "<= 32 MiB",
     ""),
]


def table(results: dict[str, list[float]], big_mb: int, repeats: int, command: str) -> str:
    lines = [f"Measured {dt.date.today()} on this 2-core machine, median of {repeats} runs.",
             f"Command: `{command}`", "",
             "| measure | atoll | target | NVIDIA FLARE 2.9 POC (issue) |",
             "| --- | --- | --- | --- |"]
    for key, label, unit, target, flare in ROWS:
        key, label = key.format(mb=big_mb), label.format(mb=big_mb)
        if key in results:
            value = statistics.median(results[key])
            lines.append(f"| {label} | {value:.3g} {unit} | {target} | {flare} |")
    return "\n".join(lines)


def write_section(text: str, name: str = "federation") -> None:
    path = ROOT / "BENCHMARKS.md"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in body and end in body:
        body = body[:body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip() + f"\n\n## Federation (issue 3)\n\n{block}\n"
    path.write_text(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big-mb", type=int, default=100)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    results = measure(args.repeats, args.big_mb)
    command = "make bench" if (args.repeats, args.big_mb) == (3, 100) else \
        f".venv/bin/python -m bench.federation --repeats {args.repeats} --big-mb {args.big_mb}"
    text = table(results, args.big_mb, args.repeats, command)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
