"""Where the tiny job's time goes, at every process, from `atoll job submit` to the last worker gone.

    .venv/bin/python bench/profile_tiny.py [--workdir DIR] [--rounds 3] [--json FILE]
        [--settle S] [--warm-jobs N]

Starts a local federation with `atoll poc up` (server and two sites, mutual TLS, the process
launcher, every worker under bubblewrap), times its restart (`poc down` then `poc up`: start ->
ready), then submits bench/compare's tiny job (4 KiB, FedAvg, 2 sites, 3 rounds) with `atoll job
submit` and waits until it finished and its workers are gone. Two sources make the timeline:

- the process tree below the three parents, read from /proc at 100 Hz (``/proc/PID/task/*/
  children``, what bwrap runs included): when each process (bwrap, worker, signature verifier)
  was first and last seen, which parent started it, and the CPU time it had used by its last
  reading; and each parent's own CPU time over the job;
- the timestamped lines the parents and workers log (job accepted, worker registered, rounds),
  and the site workers' import times (PYTHONPROFILEIMPORTTIME through the study's env).

The CLI runs with ``python -X importtime``: its import time is split from the rest (reading the
job, signing it, uploading it), and its CPU time is added to the parents' and the workers' for
the job's total: on this machine's two cores, a job whose processes need more than twice its
wall time in CPU is bound by the CPU, whatever their order. ``--warm-jobs N`` runs the same job
N times on the deployment first, so that the profile is of a job that finds the parents'
models and modules loaded (bench/compare's (a) is always a fresh deployment's first job). Every time is in milliseconds from the start of `atoll job
submit`; a process that lived less than 10 ms may be missed. CPU times move less than wall
times with other load on the machine: compare both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" / "bin"
COMPARE = REPO / "bench" / "compare" / "atoll"
SITES = ("site-1", "site-2")
ADMIN = "admin@poc.local"

LOG_TS = re.compile(r"(?:^ts=)?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _run(argv: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        pass
    return out


def _cpu(pid: int) -> float | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _argv(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return ""


def kind(argv: str) -> str:
    for needle, name in (("bwrap", "bwrap"), ("atoll.worker", "worker"),
                         ("atoll.pki.verifier", "verifier"),
                         ("atoll.pki.job_signature", "signature check (new process)")):
        words = argv.split(" ")
        if needle in words[0] or needle in words[1:4]:
            return name
    return Path(argv.split(" ")[0]).name if argv else "exited child, not yet reaped"


class Seen:
    def __init__(self, pid: int, by: str, at: float):
        self.pid, self.by, self.first, self.last = pid, by, at, at
        self.argv, self.cpu = _argv(pid), 0.0
        self.cpu_first: float | None = None  # at its first reading


class TreeSampler:
    """The processes below the parents, from /proc every ``period`` s, in a thread."""

    def __init__(self, parents: dict[int, str], period: float = 0.01):
        self.parents, self.period = parents, period
        self.seen: dict[int, Seen] = {}
        self.cpu0 = {pid: _cpu(pid) or 0.0 for pid in parents}
        self.cpu1: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for parent, name in self.parents.items():
                queue = [(c, name) for c in _children(parent)]
                while queue:
                    pid, by = queue.pop()
                    entry = self.seen.get(pid)
                    if entry is None:
                        entry = self.seen[pid] = Seen(pid, by, now)
                    entry.last = now
                    if not entry.argv or entry.argv.startswith(self.parent_argv(parent)):
                        entry.argv = _argv(pid) or entry.argv  # it may have exec'd since
                    cpu = _cpu(pid)
                    if cpu is not None:
                        entry.cpu = max(entry.cpu, cpu)
                        if entry.cpu_first is None:
                            entry.cpu_first = cpu
                    queue += [(c, f"{kind(entry.argv)} {pid}") for c in _children(pid)]
            self._stop.wait(self.period)

    def parent_argv(self, pid: int, _cache: dict[int, str] = {}) -> str:  # noqa: B006
        if pid not in _cache:
            _cache[pid] = _argv(pid)
        return _cache[pid]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.cpu1 = {pid: _cpu(pid) or 0.0 for pid in self.parents}


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
    ap.add_argument("--warm-jobs", type=int, default=0,
                    help="jobs run (and waited for) on the deployment before the one profiled")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds between the restart and the submit (bench/compare's (a) comes "
                         "after its idle window: 2 s lets the parents' verifiers and the "
                         "sandbox's probe start first, as there)")
    args = ap.parse_args()
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="atoll-profile-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ATOLL_HOME": str(work / "home")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # atoll byte-compiled once, as pip installs it
    atoll, python, ws = str(VENV / "atoll"), str(VENV / "python"), work / "ws"
    _run([python, "-m", "compileall", "-q", str(REPO / "src")], env)
    up = json.loads(_run([atoll, "poc", "up", "--reset", "--workspace", str(ws),
                          "--format", "json"], env).stdout)
    _run([atoll, "poc", "down", "--workspace", str(ws)], env)
    kits = ws / "poc"
    _map_marks(kits, work / "marks")  # as an operator does: before the sites start
    up2 = json.loads(_run([atoll, "poc", "up", "--workspace", str(ws), "--format", "json"],
                          env).stdout)
    try:
        time.sleep(args.settle)
        return profile(args, work, env, atoll, python, kits, up, up2)
    finally:
        subprocess.run([atoll, "poc", "down", "--workspace", str(ws)], env=env,
                       capture_output=True, timeout=120)


def _map_marks(kits: Path, marks: Path) -> None:
    """Each site's study_runtime.yaml: the default study gets the mark folder as a dataset, and
    its workers report their imports' times."""
    marks.mkdir(exist_ok=True)
    runtime = {"format_version": 2, "studies": {"default": {"datasets": {
        "marks": {"source": str(marks), "mode": "rw"}}}}}
    runtime["studies"]["default"]["env"] = {"PYTHONPROFILEIMPORTTIME": "1"}
    for site in SITES:
        (kits / site / "local" / "study_runtime.yaml").write_text(json.dumps(runtime))


def profile(args, work, env, atoll, python, kits, up, up2) -> int:
    marks = work / "marks"
    job = Path(_run([python, str(COMPARE / "make_job.py"), "--out", str(work / "jobs"),
                     "--name", "tiny", "--rounds", str(args.rounds), "--layers", "1024",
                     "--mark-dir", str(marks)], env).stdout.strip().splitlines()[-1])
    admin = kits / ADMIN
    for _ in range(args.warm_jobs):
        warm = json.loads(_run([atoll, "job", "submit", str(job), "--kit", str(admin),
                                "--format", "json"], env).stdout)["job_id"]
        _run([python, str(COMPARE / "ctl.py"), str(admin), "wait", warm, "120"], env, 200)
        time.sleep(args.settle)
    parents: dict[int, str] = {}
    for role, kit in [("server", kits / "server"), *[("site", kits / s) for s in SITES]]:
        doc = json.loads((kit / "workspace" / f"{role}.pid").read_text())
        parents[doc["pid"]] = f"{role} parent" if role == "server" else f"{kit.name} parent"
    sampler = TreeSampler(parents)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    sub = subprocess.run([python, "-X", "importtime", atoll, "job", "submit", str(job),
                          "--kit", str(admin), "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=300)
    t_cli = time.time()
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cli_cpu = (children1.ru_utime + children1.ru_stime
               - children0.ru_utime - children0.ru_stime)
    if sub.returncode != 0:
        sampler.stop()
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
    sampler.stop()
    rows: list[tuple[float, str, str]] = []
    total_cpu = cli_cpu + sum(sampler.cpu1[p] - sampler.cpu0[p] for p in parents)
    for seen in sampler.seen.values():
        if seen.last < t0:
            continue
        # started by the job: all its CPU is the job's; running before it (a verifier): since
        total_cpu += seen.cpu - ((seen.cpu_first or 0.0) if seen.first < t0 else 0.0)
        what = kind(seen.argv)
        rows.append((seen.first, f"{what} {seen.pid}",
                     f"first seen (started by {seen.by}); last seen at "
                     f"{(seen.last - t0) * 1000:.0f} ms; CPU {seen.cpu * 1000:.0f} ms"))
    for pid, name in parents.items():
        rows.append((t_gone, name, f"CPU {(sampler.cpu1[pid] - sampler.cpu0[pid]) * 1000:.0f} "
                                   "ms over the job (its own threads)"))
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
          f"{t_gone - t0:.3f} s; CLI: {t_cli - t0:.3f} s (imports {cli_imports:.3f} s, CPU "
          f"{cli_cpu:.3f} s)")
    print(f"CPU of the job's processes (CLI, parents, what they started): {total_cpu:.2f} s, "
          f"{total_cpu / max(t_gone - t0, 1e-9):.2f} cores on average until the last worker "
          "was gone")
    print("\n| ms | who | what |\n| ---: | --- | --- |")
    for stamp, who, what in rows:
        print(f"| {(stamp - t0) * 1000:.0f} | {who} | {what.replace('|', '/')} |")
    if args.json:
        args.json.write_text(json.dumps({"poc_up_s": up["seconds"], "poc_restart_s": up2["seconds"],
                                         "finished_s": done["t"] - t0, "gone_s": t_gone - t0,
                                         "cli_s": t_cli - t0, "cli_imports_s": cli_imports,
                                         "cli_cpu_s": cli_cpu, "cpu_s": total_cpu,
                                         "rows": [(round((s - t0) * 1000), w, m)
                                                  for s, w, m in rows]}, indent=1))
    print(f"\nwork folder: {work}")
    return 0


def _is_verifier(pid: int) -> bool:
    try:
        return b"atoll.pki.verifier" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


if __name__ == "__main__":
    sys.exit(main())
