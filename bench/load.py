"""Load with every defence on (issue 35 item 4): 100 jobs from two studies on sites with room
for two, all of them completed, none lost, and the time that took.

    .venv/bin/python -m bench.load [--jobs 100] [--no-write]      (make bench-load)

A project provisioned as `atoll provision` does (mutual TLS, signed jobs, the process launcher
with every worker under bubblewrap): a server, two sites enrolled in two studies (alpha and
beta, each site's study_runtime.yaml mapping both), and one lead per study. Each site's
local/site.yaml sets `capacity: {cpus: 2}`: room for two jobs at once (a job holds one CPU
there). The two leads submit their halves, alternating, all at once through their own sessions
(each signed with its lead's key as `atoll job submit` signs it), then wait for every job to
finish. The job: FedAvg, 3 rounds, a 4 KiB model the server makes, each site adding 1.0 (the
tiny job of bench/compare). Reported: submit of the first job until the last one finished,
each job's time from its submit to its end, how many completed, and that every job submitted
is listed in its study once and finished there (none lost, none run twice). Writes its section
of BENCHMARKS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from atoll.admin.session import Session
from atoll.parent.local_config import record_local_config
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from bench.sections import write_section

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "load"
SITES = ["site-1", "site-2"]
STUDIES = {"alpha": "lead@a.org", "beta": "lead@b.org"}
ADMIN = "admin@load.org"
BEFORE_S, TARGET_S = 95.0, 190.0  # before the trust work; issue 35: at most twice that

APP = """server:
  workflow: fedavg
  args: {num_rounds: 3, min_clients: 2, round_timeout: 600, evaluate_every: 0,
         cross_site_eval: none}
  initial_model: model.py:make
site:
  script: train.py
"""
MODEL = """import numpy as np
import atoll.client as fl


def make():
    return fl.Model(params={"w": np.zeros(1024, dtype=np.float32)})
"""
TRAIN = """import numpy as np
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    for array in model.params.values():
        np.add(array, 1.0, out=array)
    fl.send(fl.Model(params=model.params, num_examples=1))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _provision(root: Path) -> Path:
    users = [{"name": ADMIN, "org": "consortium", "role": "project_admin"}]
    users += [{"name": lead, "org": f"org-{site}", "role": "lead"}
              for lead, site in zip(STUDIES.values(), SITES, strict=True)]
    doc = {"name": PROJECT, "server": {"name": "server", "host": "127.0.0.1", "port": _port()},
           "sites": [{"name": s, "org": f"org-{s}"} for s in SITES], "users": users,
           "studies": {study: {"sites": SITES, "admins": [lead]}
                       for study, lead in STUDIES.items()}}
    provision(parse_project(doc, "bench/load.py"), root)
    kits = root / PROJECT
    for site in SITES:
        local = kits / site / "local"
        runtime = {"format_version": 2, "studies": {study: {} for study in STUDIES}}
        (local / "study_runtime.yaml").write_text(json.dumps(runtime) + "\n")
        site_yaml = local / "site.yaml"
        site_yaml.write_text(site_yaml.read_text().rstrip("\n")
                             + "\n\n# bench/load.py: room for two jobs\ncapacity: {cpus: 2}\n")
        record_local_config(local, True, kits / site / "workspace")  # as provision records it
    return kits


def _job(folder: Path, name: str) -> Path:
    (folder / "app").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(
        {"name": name, "deploy_map": {"app": ["@ALL"]}, "min_clients": 2}))
    for file, text in (("app.yaml", APP), ("model.py", MODEL), ("train.py", TRAIN)):
        (folder / "app" / file).write_text(text)
    return folder


class Parents:
    """The server and site parents as processes of their own, started and stopped here."""

    def __init__(self, kits: Path, env: dict[str, str]):
        self.kits, self.env = kits, env
        self.procs: list[subprocess.Popen] = []

    def start(self, role: str, name: str) -> None:
        ready = self.kits / f"{name}.ready"
        log = open(self.kits / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen([sys.executable, "-m", "atoll", role, "start",
                                 str(self.kits / name), "--ready-file", str(ready)],
                                stdout=log, stderr=log, env=self.env, start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.stat().st_size):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start; see {self.kits / name}.log")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _online(session: Session, study: str) -> bool:
    return {s["name"] for s in session.sites(study)["sites"] if s["online"]} >= set(SITES)


def measure(jobs: int, scratch: Path) -> dict:
    kits = _provision(scratch / "kits")
    env = {**os.environ, "ATOLL_HOME": str(scratch / "home")}
    parents = Parents(kits, env)
    folders = {study: _job(scratch / "jobs" / study, f"load-{study}") for study in STUDIES}
    try:
        parents.start("server", "server")
        for site in SITES:
            parents.start("site", site)
        sessions = {study: Session(kits / lead, study=study) for study, lead in STUDIES.items()}
        deadline = time.monotonic() + 60
        while not all(_online(s, study) for study, s in sessions.items()):
            if time.monotonic() > deadline:
                raise SystemExit("the sites did not come online in both studies")
            time.sleep(0.1)
        submitted: dict[str, tuple[str, float]] = {}  # job id -> (study, submit time)
        lock = threading.Lock()
        cpu0 = _parents_cpu(parents)
        start = time.monotonic()

        def submit_half(study: str, count: int) -> None:
            for _ in range(count):
                at = time.monotonic()
                job = sessions[study].submit(folders[study], study=study)
                with lock:
                    submitted[job["job_id"]] = (study, at)

        half = [(study, jobs // 2 + (i < jobs % 2)) for i, study in enumerate(STUDIES)]
        threads = [threading.Thread(target=submit_half, args=pair) for pair in half]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        submit_s = time.monotonic() - start
        ended: dict[str, tuple[str, float]] = {}  # job id -> (state, end time)
        deadline = start + 30 * 60
        while len(ended) < len(submitted) and time.monotonic() < deadline:
            for study, session in sessions.items():
                for row in session.list_jobs(study):
                    if row["job_id"] in submitted and row["job_id"] not in ended \
                            and row["state"].startswith("FINISHED"):
                        ended[row["job_id"]] = (row["state"], time.monotonic())
            time.sleep(0.2)
        total_s = max((t for _, t in ended.values()), default=time.monotonic()) - start
        listed = {study: [r["job_id"] for r in session.list_jobs(study)]
                  for study, session in sessions.items()}
        cpu_s = _parents_cpu(parents) - cpu0
        for session in sessions.values():
            session.close()
    finally:
        parents.stop()
    per_job = [ended[j][1] - at for j, (_, at) in submitted.items() if j in ended]
    lost = [j for j in submitted if j not in ended]
    twice = [j for j in submitted
             if sum(ids.count(j) for ids in listed.values()) != 1
             or j not in listed[submitted[j][0]]]
    return {
        "jobs": jobs, "submitted": len(submitted),
        "completed": sum(1 for s, _ in ended.values() if s == "FINISHED:COMPLETED"),
        "states": {s: sum(1 for x, _ in ended.values() if x == s)
                   for s in {x for x, _ in ended.values()}},
        "lost": len(lost), "listed_wrong": len(twice),
        "total_s": total_s, "submit_s": submit_s,
        "per_job_median_s": statistics.median(per_job) if per_job else None,
        "per_job_max_s": max(per_job) if per_job else None,
        "parents_cpu_s": cpu_s,
        "load_average": os.getloadavg(),
    }


TICKS = os.sysconf("SC_CLK_TCK")


def _parents_cpu(parents: Parents) -> float:
    """The parents' own CPU (user + system), from /proc; not their workers' (what runs under
    bwrap does not reach its parent's reaped-children times)."""
    total = 0
    for proc in parents.procs:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime stime
    return total / TICKS


def table(result: dict, command: str) -> str:
    ok = (result["completed"] == result["jobs"] and not result["lost"]
          and not result["listed_wrong"])
    load = ", ".join(f"{x:.1f}" for x in result["load_average"])
    return "\n".join([
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on this machine "
        f"({os.cpu_count()} CPUs; load average at the end {load}), one run of:",
        "", f"    {command}", "",
        "| measure | atoll | before the trust work | target |",
        "| --- | --- | --- | --- |",
        f"| {result['jobs']} jobs, two studies, sites with room for two: first submit -> last "
        f"finished | {result['total_s']:.1f} s | {BEFORE_S:.0f} s | <= {TARGET_S:.0f} s |",
        f"| completed / submitted / lost / listed other than once in its study | "
        f"{result['completed']} / {result['submitted']} / {result['lost']} / "
        f"{result['listed_wrong']} | | all / all / 0 / 0 |",
        f"| all submits (two leads at once) | {result['submit_s']:.1f} s | | |",
        f"| one job, its submit -> finished (median / max: the queue's wait included) | "
        f"{result['per_job_median_s']:.1f} / {result['per_job_max_s']:.1f} s | | |",
        f"| CPU of the three parents themselves, first submit -> last finished | "
        f"{result['parents_cpu_s']:.1f} s | | |",
        "", ("All completed, none lost." if ok else
             f"NOT all completed: {json.dumps(result['states'])}"),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="atoll-load-") as tmp:
        result = measure(args.jobs, Path(tmp))
    command = "make bench-load" if args.jobs == 100 else \
        f".venv/bin/python -m bench.load --jobs {args.jobs}"
    text = table(result, command)
    print(json.dumps(result))
    print(text)
    if not args.no_write:
        write_section(ROOT / "BENCHMARKS.md", "load", "Load: 100 jobs, two studies (issue 35)",
                      text)
    ok = result["completed"] == args.jobs and not result["lost"] and not result["listed_wrong"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
