"""Scale run (issue 9, item 3): one real server parent, many simulated sites, one job to all.

    .venv/bin/python -m bench.scale [--sites 100,300,1000] [--rounds 3] [--payload-bytes 4096]

For each site count N: provision a project (server + admin) with `atoll.pki`, issue N site
certificates with the project's CA, start the real server parent (`atoll server start KIT`,
mutual TLS on 127.0.0.1), start the simulated sites (bench/scale_sites.py: the real Federation
protocol over one TLS connection per site, a few processes of grpc.aio), and wait until the
admin's Session lists all N online. Then, with every site heartbeating, measure the server idle;
submit a scatter_gather job (`@ALL`, min_clients N, a small payload) and measure:

- connect: simulated sites started -> all N listed online;
- deploy: submit -> every site RUNNING (the last site's RUNNING report, seen at the site);
- per round: mean interval between consecutive rounds' first task arrival at any site, and each
  round's spread (first task -> last reply); with three rounds or more also the mean interval
  from round 2 on (`round_after_first_s`), as round 1's first tasks overlap the deploy's tail,
  and the server's CPU per site and round over those rounds alone;
- the server parent's and the server worker's RSS and CPU (from /proc) per phase.

Results go to BENCHMARKS.md between `<!-- scale:begin -->` and `<!-- scale:end -->` and, raw, to
bench/scale_last_run.json. Every process started here is stopped before the run ends.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from bench.scale_proc import Sampler
from bench.scale_report import render, write_section
from bench.scale_sites import raise_fd_limit

ROOT = Path(__file__).resolve().parent.parent
ATOLL = str(ROOT / ".venv" / "bin" / "atoll")
ADMIN = "admin@scale.local"
SITES_PER_PROCESS = int(os.environ.get("SCALE_SITES_PER_PROCESS", "250"))
# the server's site.yaml links.tls_record_bytes, as docs/site-config.md advises for thousands of
# sites with small models (SCALE_TLS_RECORD=16384: gRPC's default)
TLS_RECORD = int(os.environ.get("SCALE_TLS_RECORD", "4096"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fds(pid: int) -> list[int]:
    """[open, soft limit] of a process's file descriptors."""
    try:
        limit = next(line.split()[3] for line in Path(f"/proc/{pid}/limits").read_text()
                     .splitlines() if line.startswith("Max open files"))
        return [len(os.listdir(f"/proc/{pid}/fd")), int(limit)]
    except (OSError, StopIteration, ValueError):
        return []


# -- one run ----------------------------------------------------------------------------------
class ScaleRun:
    def __init__(self, n: int, rounds: int, payload: int, work: Path):
        self.n, self.rounds, self.payload, self.work = n, rounds, payload, work
        self.profile = False
        self.idle_s = 10.0  # how long the server is measured idle with every site connected
        self.procs: list[subprocess.Popen] = []
        self.server: subprocess.Popen | None = None
        self.result: dict = {"sites": n, "rounds": rounds, "payload_bytes": payload}

    def provision(self) -> None:
        from atoll.pki.ca import load_ca
        from atoll.pki.certs import issue_cert
        from atoll.pki.project import parse_project
        from atoll.pki.provision import provision

        port = free_port()
        project = parse_project(
            {
                "name": "scale",
                "server": {"name": "server", "host": "127.0.0.1", "port": port},
                "users": [{"name": ADMIN, "org": "scale", "role": "project_admin"}],
            }
        )
        provision(project, self.work, force=True)
        self.kits = self.work / "scale"
        site_yaml = self.kits / "server" / "local" / "site.yaml"
        site_yaml.write_text(site_yaml.read_text().rstrip("\n")
                             + f"\nlinks: {{tls_record_bytes: {TLS_RECORD}}}\n")
        self.result["tls_record_bytes"] = TLS_RECORD
        ca = load_ca(self.kits / "ca")
        certs = self.work / "sims"
        certs.mkdir()
        t0 = time.monotonic()
        sites = []
        for i in range(1, self.n + 1):
            name = f"sim-{i:05d}"
            cert, key = certs / f"{name}.crt", certs / f"{name}.key"
            issue_cert(ca, name, f"org-{i % 50}", "site").write(cert, key)
            sites.append([name, str(cert), str(key)])
        self.result["issue_certs_s"] = time.monotonic() - t0
        self.manifest = self.work / "manifest.json"
        self.manifest.write_text(
            json.dumps(
                {
                    "address": f"127.0.0.1:{port}",
                    "ca": str(self.kits / "ca" / "rootCA.pem"),
                    "sites": sites,
                }
            )
        )
        self.port = port

    def start_server(self) -> None:
        logf = open(self.work / "server.log", "ab")
        argv = [ATOLL, "server", "start", str(self.kits / "server")]
        self.server = subprocess.Popen(
            argv,
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        threading.Thread(target=self.server.wait, daemon=True).start()  # reap at once
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the server did not listen within 60 s; see {self.work}/server.log")

    def start_sites(self) -> None:
        per = max(1, min(SITES_PER_PROCESS, -(-self.n // 4)))  # at least 4 processes
        for first in range(0, self.n, per):
            count = min(per, self.n - first)
            logf = open(self.work / f"sims-{first}.log", "ab")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.scale_sites", str(self.manifest),
                     "--first", str(first), "--count", str(count),
                     "--events", str(self.work / f"events-{first}.jsonl")],
                    cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        self.result["site_processes"] = len(self.procs)

    def run(self, session_cls) -> dict:
        self.provision()
        self.start_server()
        assert self.server is not None
        sampler = Sampler(self.server.pid)
        try:
            with session_cls(self.kits / ADMIN, timeout=60) as session:
                session.sites()  # the admin link is up before the clock starts
                t_start = time.time()
                self.start_sites()
                online = self._wait_online(session, timeout=min(30 + 0.05 * self.n, 180))
                t_online = time.time()
                self.result["connect_s"] = t_online - t_start
                self.result["connect"] = sampler.window(t_start, t_online)
                self.result["server_fds"] = _fds(self.server.pid)
                if online < self.n:
                    self.result["error"] = (
                        f"the admin saw {online} of {self.n} sites online after "
                        f"{t_online - t_start:.0f} s"
                    )
                    self._dump_server("connect")
                    self.stop()
                    self._events()
                    return self.result
                if self.idle_s:
                    time.sleep(3.0)  # let the connection storm settle
                    t_idle = time.time()
                    time.sleep(self.idle_s)  # 10 s: two heartbeats per site
                    self.result["idle"] = sampler.window(t_idle, time.time())
                self._job(session, sampler)
        finally:
            sampler.stop()
            self.stop()
        self._events()
        if "rounds_from" in self.result:  # the rounds alone: first task -> last reply
            window = sampler.window(self.result["rounds_from"], self.result["rounds_to"])
            self.result["rounds_window"] = window
            if window and self.n and self.rounds:
                self.result["server_cpu_ms_per_site_round"] = (
                    1000 * window["server_cpu_s"] / (self.n * self.rounds))
            if "steady_from" in self.result:  # the same from round 2 on, without the deploy
                steady = sampler.window(self.result["steady_from"], self.result["rounds_to"])
                self.result["steady_window"] = steady
                if steady and self.n:
                    self.result["server_cpu_ms_per_site_round_after_first"] = (
                        1000 * steady["server_cpu_s"] / (self.n * self.result["steady_rounds"]))
        return self.result

    def _count_connected(self, events: list[dict]) -> None:
        connected = {e["site"] for e in events if e["event"] == "connected"}
        self.result["sites_welcomed"] = len(connected)

    def _wait_online(self, session, timeout: float) -> int:
        from atoll.admin.errors import AtollError

        deadline = time.monotonic() + timeout
        online = 0
        while time.monotonic() < deadline:
            try:
                online = sum(1 for s in session.sites()["sites"] if s["online"])
            except AtollError as exc:  # a server too busy to answer the admin is a result too
                self.result.setdefault("admin_errors", []).append(str(exc)[:200])
            if online >= self.n:
                break
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a simulated-site process exited; see {self.work}/sims-*.log")
            time.sleep(0.2 if self.n <= 1000 else 1.0)  # a 10,000-site list is no free call
        return online

    def _job(self, session, sampler: Sampler) -> None:
        from atoll.admin.errors import AtollError

        job = self.work / "job"
        (job / "app").mkdir(parents=True)
        (job / "meta.json").write_text(
            json.dumps({"name": f"scale-{self.n}", "deploy_map": {"app": ["@ALL"]},
                        "min_clients": self.n})
        )
        (job / "app" / "app.yaml").write_text(
            "server:\n  workflow: scatter_gather\n"
            f"  args: {{num_rounds: {self.rounds}, payload_bytes: {self.payload}, "
            f"min_clients: {self.n}, round_timeout: 600}}\n"
            "site:\n  script: echo.py\n"
        )
        (job / "app" / "echo.py").write_text(
            "import atoll.client as fl\nfl.init()\nwhile fl.is_running():\n"
            "    m = fl.receive()\n    fl.send(fl.Model(params=m.params, num_examples=1))\n"
        )
        spy = self._profile_start() if self.profile else None
        t_submit = time.time()
        job_id = session.submit(job)["job_id"]
        self.result["submit_call_s"] = time.time() - t_submit
        self.result["t_submit"] = t_submit
        deadline = time.monotonic() + min(120 + 60 * self.rounds + 0.05 * self.n, 600)
        state = ""
        status: dict = {}
        while time.monotonic() < deadline:
            try:
                status = session.status(job_id)
            except AtollError as exc:  # a server too busy to answer the admin is a result too
                self.result.setdefault("admin_errors", []).append(str(exc)[:200])
                time.sleep(0.5)
                continue
            state = status["state"]
            if state.startswith("FINISHED"):
                break
            time.sleep(0.5)
        t_end = time.time()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile when interrupted
            spy.wait(timeout=60)
        self.result["job_state"] = state
        self.result["job_reason"] = status.get("reason", "")
        self.result["job_wall_s"] = t_end - t_submit
        self.result["job"] = sampler.window(t_submit, t_end)
        if not state.startswith("FINISHED"):
            self._dump_server("job")
            session.abort(job_id)

    def _profile_start(self) -> subprocess.Popen:
        """py-spy on the server parent for the job (collapsed stacks, read-only sampling)."""
        assert self.server is not None
        out = self.work / "server-profile.txt"
        self.result["job_profile"] = str(out)
        return subprocess.Popen(
            # SCALE_PROFILE=native: C frames too (gRPC's core, OpenSSL); py-spy then pauses
            # the process at each sample, so its CPU figures are not comparable.
            # SCALE_PROFILE=gil: only the thread holding the GIL, where Python's CPU goes (a
            # thread waiting for the GIL after a SQLite call otherwise counts as busy)
            [str(ROOT / ".venv" / "bin" / "py-spy"), "record", "--pid", str(self.server.pid),
             "--rate", "50", "--format", "raw", "--output", str(out),
             *{"native": ["--native", "--threads"], "gil": ["--gil", "--nonblocking"]}.get(
                 os.environ.get("SCALE_PROFILE", ""), ["--nonblocking"])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _dump_server(self, phase: str) -> None:
        """Where the server's threads are when it falls behind (py-spy, read-only)."""
        assert self.server is not None
        out = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "py-spy"), "dump", "--pid", str(self.server.pid)],
            capture_output=True, text=True, timeout=60,
        )
        path = self.work / f"server-dump-{phase}.txt"
        path.write_text(out.stdout + out.stderr)
        self.result[f"{phase}_dump"] = str(path)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.server is not None and self.server.poll() is None:
            subprocess.run([ATOLL, "server", "stop", str(self.kits / "server")],
                           capture_output=True, timeout=60)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()

    def _events(self) -> None:
        """Deploy and round times from what the simulated sites saw."""
        events = []
        for path in self.work.glob("events-*.jsonl"):
            events += [json.loads(line) for line in path.read_text().splitlines()]
        self._count_connected(events)
        t0 = self.result.get("t_submit")
        if t0 is None:
            return
        running = [e["t"] for e in events if e["event"] == "RUNNING"]
        if len(running) == self.n:
            self.result["deploy_s"] = max(running) - t0
            self.result["deploy_median_s"] = sorted(running)[len(running) // 2] - t0
        tasks: dict[int, list[float]] = {}
        replies: dict[int, list[float]] = {}
        for e in events:
            if e["event"] == "task" and e["round"] is not None:
                tasks.setdefault(e["round"], []).append(e["t"])
            elif e["event"] == "reply" and e["round"] is not None:
                replies.setdefault(e["round"], []).append(e["t"])
        firsts = [min(tasks[r]) for r in sorted(tasks)]
        if len(firsts) >= 2:
            self.result["round_s"] = (firsts[-1] - firsts[0]) / (len(firsts) - 1)
        if len(firsts) >= 3:  # without round 1, whose first tasks overlap the deploy's tail
            self.result["round_after_first_s"] = (firsts[-1] - firsts[1]) / (len(firsts) - 2)
            self.result["steady_from"], self.result["steady_rounds"] = firsts[1], len(firsts) - 1
        self.result["round_spread_s"] = [
            max(replies.get(r, [0.0])) - min(tasks[r]) for r in sorted(tasks)
        ]
        self.result["tasks_per_round"] = [len(tasks[r]) for r in sorted(tasks)]
        if tasks and replies:
            self.result["rounds_from"] = min(tasks[min(tasks)])
            self.result["rounds_to"] = max(max(v) for v in replies.values())
        failed: dict[str, int] = {}
        for e in events:  # a site's job call that ended in an error, by its status code
            if e["event"].startswith("job call failed: "):
                code = e["event"].split(": ")[1]
                failed[code] = failed.get(code, 0) + 1
        if failed:
            self.result["job_calls_failed"] = failed
        broken = [e for e in events if e["event"].startswith("link broken")]
        if broken:
            self.result["links_broken"] = len(broken)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", default="100,300,1000", help="comma-separated site counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--payload-bytes", type=int, default=4096)
    parser.add_argument("--workdir", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--no-write", action="store_true", help="print only, write no file")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the server parent during each job (raw stacks in the workdir)")
    args = parser.parse_args(argv)
    from atoll.admin.session import Session

    counts = [int(x) for x in args.sites.split(",") if x.strip()]
    raise_fd_limit(4 * max(counts) + 1024)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="atoll-scale-"))
    results = []
    for n in counts:
        work = root / f"n{n}"
        work.mkdir(parents=True, exist_ok=True)
        log(f"{n} simulated sites, {args.rounds} rounds of {args.payload_bytes} B in {work}")
        try:
            run = ScaleRun(n, args.rounds, args.payload_bytes, work)
            run.profile = args.profile
            result = run.run(Session)
        except Exception as exc:  # noqa: BLE001 - record and go on with the next size
            result = {"sites": n, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-3000:]}
        log(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
        results.append(result)
    command = "python -m bench.scale " + " ".join(argv)
    env = " ".join(f"{k}={os.environ[k]}" for k in ("SCALE_SITES_PER_PROCESS", "SCALE_TASKS",
                                                   "SCALE_CONNECTING", "SCALE_TLS_RECORD")
                   if k in os.environ)
    block = render(results, command.strip(), env)
    print(block)
    (root / "results.json").write_text(json.dumps(results, indent=1))
    log(f"raw results: {root / 'results.json'}")
    if not args.no_write:
        write_section(ROOT / "BENCHMARKS.md", block)
        (ROOT / "bench" / "scale_last_run.json").write_text(json.dumps(results, indent=1))
        log("wrote BENCHMARKS.md and bench/scale_last_run.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
