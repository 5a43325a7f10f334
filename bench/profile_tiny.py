"""Where the tiny job's time goes, at every process, from `atoll job submit` to the last worker gone.

    .venv/bin/python bench/profile_tiny.py [--workdir DIR] [--rounds 3] [--json FILE]

Starts a local federation with `atoll poc up` (server and two sites, mutual TLS, the process
launcher, every worker under bubblewrap), times its restart (`poc down` then `poc up`: start ->
ready), then submits bench/compare's tiny job (4 KiB, FedAvg, 2 sites, 3 rounds) with `atoll job
submit` and waits until it finished and its workers are gone. Two sources make the timeline:

- the process tree, traced by strace attached to the three parents (``-f``, only process
  creation, exec and exit, filtered in the kernel with ``--seccomp-bpf``): when each process
  (worker, bwrap, signature verifier) started and ended, and which parent started it;
- the timestamped lines the parents and workers log (job accepted, worker registered, rounds).

The CLI runs with ``python -X importtime``: its import time is split from the rest (reading the
job, signing it, uploading it). Every time is in milliseconds from the start of `atoll job
submit`. strace costs the traced processes a little at each fork and exec; compare runs of this
script with each other, and bench/compare/run.py for the untraced numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" / "bin"
COMPARE = REPO / "bench" / "compare" / "atoll"
SITES = ("site-1", "site-2")
ADMIN = "admin@poc.local"

TRACE = re.compile(r"^(\d+) +(\d\d):(\d\d):(\d\d\.\d+) (.*)$")
LOG_TS = re.compile(r"(?:^ts=)?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _run(argv: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def _day_seconds(stamp: float) -> float:
    """Seconds since local midnight (strace -tt prints the time of day)."""
    lt = time.localtime(stamp)
    midnight = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))
    return stamp - midnight


class Proc:
    def __init__(self, pid: int, parent: int | None, born: float):
        self.pid, self.parent, self.born = pid, parent, born
        self.exec_at: float | None = None
        self.argv = ""
        self.ended: float | None = None
        self.threads: set[int] = set()

    def kind(self, parents: dict[int, str]) -> str:
        argv = self.argv
        if self.pid in parents:
            return parents[self.pid]
        for needle, name in (("atoll.worker", "worker"), ("atoll.pki.verifier", "verifier"),
                             ("atoll.pki.job_signature", "signature check (new process)"),
                             ("bwrap", "bwrap")):
            if needle in argv:
                return name
        return Path(argv.split(" ")[0]).name if argv else "fork"


def parse_trace(path: Path, parents: dict[int, str],
                threads: dict[int, int]) -> dict[int, Proc]:
    """Processes below the parents from strace -f -tt output (pid-prefixed lines); ``threads``:
    the parents' threads when strace attached (thread id -> parent)."""
    procs: dict[int, Proc] = {pid: Proc(pid, None, 0.0) for pid in parents}
    owner: dict[int, int] = {pid: pid for pid in parents} | threads  # thread id -> process
    for line in path.read_text(errors="replace").splitlines():
        m = TRACE.match(line)
        if not m:
            continue
        tid = int(m[1])
        t = int(m[2]) * 3600 + int(m[3]) * 60 + float(m[4])
        rest = m[5]
        pid = owner.setdefault(tid, tid)
        if pid not in procs:
            procs[pid] = Proc(pid, None, t)
        if rest.startswith(("clone(", "clone3(", "vfork(", "fork(")):
            child = re.search(r"= (\d+)$", rest)
            if child is None:
                continue
            new = int(child[1])
            if "CLONE_THREAD" in rest:
                owner[new] = pid
                procs[pid].threads.add(new)
            else:
                owner[new] = new
                procs.setdefault(new, Proc(new, pid, t)).parent = pid
        elif rest.startswith("execve(") and rest.rstrip().endswith("= 0"):
            args = re.findall(r'"((?:[^"\\]|\\.)*)"', rest.split("], ")[0])
            procs[pid].exec_at = t
            procs[pid].argv = " ".join(args[1:])
        elif "+++ exited with" in rest or "+++ killed by" in rest:
            if tid == pid:
                procs[pid].ended = t
    return procs


def log_lines(path: Path, t0: float, t1: float) -> list[tuple[float, str]]:
    out = []
    if not path.is_file():
        return out
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_TS.search(line)
        if not m:
            continue
        stamp = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if t0 - 0.001 <= stamp <= t1 + 0.5:
            msg = line[m.end():]
            msg = re.sub(r"^ level=\w+ component=", "", msg).strip(" :")
            out.append((stamp, msg[:150]))
    return out


def import_time(stderr: str) -> float:
    """The CLI's import time (seconds): the sum of -X importtime's top-level cumulative times."""
    total = 0
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m and not m[2].startswith(" "):
            total += int(m[1])
    return total / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the timeline as JSON")
    args = ap.parse_args()
    if shutil.which("strace") is None:
        sys.exit("strace is needed (apt-get install strace)")
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="atoll-profile-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ATOLL_HOME": str(work / "home")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # atoll byte-compiled once, as pip installs it
    atoll, python, ws = str(VENV / "atoll"), str(VENV / "python"), work / "ws"
    _run([python, "-m", "compileall", "-q", str(REPO / "src")], env)
    up = json.loads(_run([atoll, "poc", "up", "--reset", "--workspace", str(ws),
                          "--format", "json"], env).stdout)
    _run([atoll, "poc", "down", "--workspace", str(ws)], env)
    up2 = json.loads(_run([atoll, "poc", "up", "--workspace", str(ws), "--format", "json"],
                          env).stdout)
    kits = ws / "poc"
    try:
        return profile(args, work, env, atoll, python, kits, up, up2)
    finally:
        subprocess.run([atoll, "poc", "down", "--workspace", str(ws)], env=env,
                       capture_output=True, timeout=120)


def profile(args, work, env, atoll, python, kits, up, up2) -> int:
    marks = work / "marks"
    marks.mkdir(exist_ok=True)
    runtime = {"format_version": 2, "studies": {"default": {"datasets": {
        "marks": {"source": str(marks), "mode": "rw"}}}}}
    for site in SITES:
        (kits / site / "local" / "study_runtime.yaml").write_text(json.dumps(runtime))
    job = Path(_run([python, str(COMPARE / "make_job.py"), "--out", str(work / "jobs"),
                     "--name", "tiny", "--rounds", str(args.rounds), "--layers", "1024",
                     "--mark-dir", str(marks)], env).stdout.strip().splitlines()[-1])
    parents: dict[int, str] = {}
    for role, kit in [("server", kits / "server"), *[("site", kits / s) for s in SITES]]:
        doc = json.loads((kit / "workspace" / f"{role}.pid").read_text())
        parents[doc["pid"]] = f"{role} parent" if role == "server" else f"{kit.name} parent"
    trace = work / "parents.trace"
    strace = subprocess.Popen(
        ["strace", "-f", "-tt", "-q", "--seccomp-bpf", "-e", "trace=process", "-e",
         "signal=none", "-o", str(trace), *[a for p in parents for a in ("-p", str(p))]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # strace attaches to each parent and its threads
    threads = {int(t.name): pid for pid in parents for t in Path(f"/proc/{pid}/task").iterdir()}
    if strace.poll() is not None:
        sys.exit("strace could not attach to the parents (ptrace_scope?)")
    admin = kits / ADMIN
    t0 = time.time()
    sub = subprocess.run([python, "-X", "importtime", atoll, "job", "submit", str(job),
                          "--kit", str(admin), "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=300)
    t_cli = time.time()
    if sub.returncode != 0:
        strace.send_signal(signal.SIGINT)
        sys.exit(f"submit failed: {sub.stdout}{sub.stderr[-3000:]}")
    job_id = json.loads(sub.stdout)["job_id"]
    done = json.loads(_run([python, str(COMPARE / "ctl.py"), str(admin), "wait", job_id, "120"],
                           env, 200).stdout.strip().splitlines()[-1])
    # the workers are gone once no process below a parent is left but its verifier
    deadline = time.time() + 60
    while time.time() < deadline:
        rest = [c for p in parents for c in _children(p) if not _is_verifier(c)]
        if not rest:
            break
        time.sleep(0.05)
    t_gone = time.time()
    time.sleep(0.3)
    strace.send_signal(signal.SIGINT)
    strace.wait(30)
    midnight = t0 - _day_seconds(t0)
    procs = parse_trace(trace, parents, threads)
    rows: list[tuple[float, str, str]] = []
    for proc in procs.values():
        if proc.pid in parents:
            continue
        start = midnight + (proc.exec_at if proc.exec_at is not None else proc.born)
        if proc.ended is not None and midnight + proc.ended < t0:
            continue
        owner = procs.get(proc.parent)
        by = owner.kind(parents) if owner else "?"
        end = f"{(midnight + proc.ended - t0) * 1000:.0f}" if proc.ended else "running"
        rows.append((start, f"process {proc.kind(parents)} (pid {proc.pid}, by {by})",
                     f"ended at {end}"))
    logs = [(kits / "server" / "workspace" / "server.log", "server parent")]
    logs += [(kits / s / "workspace" / "site.log", f"{s} parent") for s in SITES]
    for path in (kits / "server" / "workspace" / "jobs" / job_id).rglob("worker.log"):
        logs.append((path, "server worker"))
    for s in SITES:
        for path in (kits / s / "workspace" / "jobs" / job_id).rglob("worker.log"):
            logs.append((path, f"{s} worker"))
    for path, who in logs:
        for stamp, msg in log_lines(path, t0, t_gone):
            rows.append((stamp, who, msg))
    cli_imports = import_time(sub.stderr)
    rows.append((t0, "CLI", "atoll job submit starts"))
    rows.append((t0 + cli_imports, "CLI", f"imports done ({cli_imports * 1000:.0f} ms)"))
    rows.append((t_cli, "CLI", "atoll job submit returns"))
    rows.append((done["t"], "ctl", f"job seen {done['status']}"))
    rows.append((t_gone, "harness", "no worker left"))
    rows.sort()
    print(f"poc up (provisions): {up['seconds']:.2f} s; poc up (restart, start -> ready): "
          f"{up2['seconds']:.2f} s")
    print(f"submit -> finished: {done['t'] - t0:.3f} s; submit -> last worker gone: "
          f"{t_gone - t0:.3f} s; CLI: {t_cli - t0:.3f} s (imports {cli_imports:.3f} s)")
    print("\n| ms | who | what |\n| ---: | --- | --- |")
    for stamp, who, what in rows:
        print(f"| {(stamp - t0) * 1000:.0f} | {who} | {what.replace('|', '/')} |")
    if args.json:
        args.json.write_text(json.dumps({"poc_up_s": up["seconds"], "poc_restart_s": up2["seconds"],
                                         "finished_s": done["t"] - t0, "gone_s": t_gone - t0,
                                         "cli_s": t_cli - t0, "cli_imports_s": cli_imports,
                                         "rows": [(round((s - t0) * 1000), w, m)
                                                  for s, w, m in rows]}, indent=1))
    print(f"\nwork folder: {work}")
    return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        pass
    return out


def _is_verifier(pid: int) -> bool:
    try:
        return b"atoll.pki.verifier" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


if __name__ == "__main__":
    sys.exit(main())
