"""atoll in deployment mode: a server parent and two site parents as separate processes, mTLS.

Uses atoll's own tools only: `atoll provision` for the CA and the kits, `atoll server start` /
`atoll site start` in the foreground (so the harness tags and measures them, and their job
workers with them), the `atoll job submit|list|abort` CLI as a user runs it, and one
`atoll.admin.session.Session` per poll loop (bench/compare/atoll/ctl.py) to watch readiness and job
status. ATOLL_HOME points into the run's work folder so no saved login of the user is used.
Mutual TLS is always on in atoll; every job worker runs through the process launcher, which
confines it (`process.sandbox: bwrap`, the default since issue 19): the site script reaches the
harness's mark folder as the study's dataset `marks`, read-write, which the driver maps in each
site's local/study_runtime.yaml before each job.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from proctree import Proc, ProcessTable, _stat

from drivers.base import (
    COMPARE_DIR,
    REPO,
    Driver,
    DriverError,
    JobRun,
    free_port_block,
    layer_counts,
)

ATOLL_DIR = COMPARE_DIR / "atoll"
VENV = REPO / ".venv"
ADMIN = "admin@bench.local"
SITES = ("site-1", "site-2")
MARKS_DATASET = "marks"  # the job's name for the mark folder (site_train.py)

# Each site's local/study_runtime.yaml, written once before the deployment starts, as an
# operator configures a site: the benchmark jobs run in the default study and get the
# deployment's mark folder as a dataset (the only way a confined worker reaches a host folder
# outside its run folder), each job writing into a folder of its own there. JSON is YAML.
# (Until 2026-12-07 the file was written again before each job, mapping that job's folder:
# every job was then the first after an edit of the site's settings, which a site parent reads
# through the models.)
STUDY_RUNTIME = """\
# local/study_runtime.yaml, written by bench/compare (drivers/atoll.py) before the start
{doc}
"""

PROJECT_YAML = """\
name: bench
server: {{name: server, host: 127.0.0.1, port: {port}}}
sites:
{sites}
users:
  - {{name: {admin}, org: bench, role: project_admin}}
"""


class AtollDriver(Driver):
    name = "atoll"
    title = "atoll"
    _compiled = False  # src/ byte-compiled once per run
    # Set by run.py for the sandbox's cost: each job's CPU time, all processes (JobRun.extra).
    measure_cpu = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.python = str(VENV / "bin" / "python")
        self.atoll = str(VENV / "bin" / "atoll")
        self.port = 0
        self.table = WorkerAwareTable(self.tag)

    @property
    def kits(self) -> Path:
        return self.workdir / "kits" / "bench"

    @property
    def admin_kit(self) -> Path:
        return self.kits / ADMIN

    def missing(self) -> str | None:
        if not Path(self.atoll).exists():
            return f"{self.atoll} is missing: run `make test` or `make demo` once to create .venv"
        return None

    def system_env(self) -> dict[str, str]:
        return {"ATOLL_HOME": str(self.workdir / "home")}

    # -- deployment --------------------------------------------------------------------
    def prepare(self) -> None:
        self._byte_compile()
        (self.workdir / "home").mkdir(parents=True, exist_ok=True)
        self.port = free_port_block(1, start=30000)
        project = self.workdir / "project.yaml"
        project.write_text(
            PROJECT_YAML.format(
                port=self.port,
                admin=ADMIN,
                sites="\n".join(f"  - {{name: {s}, org: org-{s[-1]}}}" for s in SITES),
            )
        )
        self.run_cmd(
            [self.atoll, "provision", str(project), "--out", str(self.workdir / "kits")],
            timeout=120,
        )
        if not self.admin_kit.is_dir():
            raise DriverError(f"atoll: provision made no admin kit at {self.admin_kit}")
        self._map_marks(self.workdir / "lent-marks")
        for site in SITES:  # as an operator checks an edit: the start then skips the check
            self.run_cmd([self.atoll, "site", "validate", str(self.kits / site)], timeout=120)

    def start_deployment(self) -> None:
        parents = [self.spawn([self.atoll, "server", "start", str(self.kits / "server")],
                              "server.log")]
        for site in SITES:
            parents.append(
                self.spawn([self.atoll, "site", "start", str(self.kits / site)], f"{site}.log")
            )
        # Reap each parent as soon as it exits: `atoll site|server stop` waits until the pid is
        # gone, and an unreaped child of this harness would linger as a zombie until SIGKILL.
        for proc in parents:
            threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()

    def watcher_argv(self, verb: str) -> list[str]:
        return [self.python, str(ATOLL_DIR / "ctl.py"), str(self.admin_kit), verb]

    # -- jobs --------------------------------------------------------------------------
    def prepare_job(
        self, model_mb: float, rounds: int, mark_dir: Path, shape: str = "flat"
    ) -> Path:
        jobs = self.workdir / "jobs"
        name = f"bench-{len(list(jobs.glob('*'))) if jobs.exists() else 0}"
        self._lend_marks(mark_dir, name)
        res = self.run_cmd(
            [
                self.python,
                str(ATOLL_DIR / "make_job.py"),
                "--out",
                str(jobs),
                "--name",
                name,
                "--rounds",
                str(rounds),
                "--layers",
                ",".join(str(n) for n in layer_counts(model_mb, shape, 2 if shape == "llm" else 4)),
                "--dtype",
                "bf16" if shape == "llm" else "float32",
                # issue 40: the sum of a bf16 model (float32, twice its size) on disk
                "--accumulator",
                "disk" if shape == "llm" else "memory",
                "--mark-dir",
                str(mark_dir),
                "--mark-sub",
                name,
            ],
            timeout=300,
        )
        return Path(res.stdout.strip().splitlines()[-1])

    def _admin(self, *args: str, timeout: float = 120) -> dict | list:
        res = self.run_cmd(
            [self.atoll, *args, "--kit", str(self.admin_kit), "--format", "json"], timeout=timeout
        )
        try:
            return json.loads(res.stdout)
        except ValueError:
            raise DriverError(
                f"atoll: `atoll {' '.join(args)}` printed no JSON: {res.stdout[-500:]}"
            ) from None

    def submit(self, job: object) -> JobRun:
        cpu = None
        if self.measure_cpu:
            parents = [p.pid for p in ProcessTable.scan(self.table) if p.role == "deployment"]
            cpu = CpuSampler(parents)
        watcher = self.watcher("wait")
        t0 = time.time()
        try:
            answer = self._admin("job", "submit", str(job), timeout=600)
        except BaseException:
            watcher.drop()
            if cpu is not None:
                cpu.stop()
            raise
        job_id = answer.get("job_id") if isinstance(answer, dict) else None
        if not job_id:
            raise DriverError(f"atoll: no job_id in the submit output: {answer}")
        extra = {"submit_cli_s": time.time() - t0, "watcher": watcher}
        if cpu is not None:
            extra["cpu_sampler"] = cpu
        return JobRun(job_id=job_id, submitted_at=t0, extra=extra)

    def wait_finished(self, run: JobRun, timeout: float) -> None:
        try:
            answer = run.extra.pop("watcher").go(run.job_id, timeout)
        except BaseException:
            if "cpu_sampler" in run.extra:
                run.extra.pop("cpu_sampler").stop()
            raise
        if not answer.get("finished"):
            raise DriverError(f"atoll: job {run.job_id} not finished in {timeout} s: {answer}")
        run.finished_at, run.status = answer["t"], answer["status"]
        if "cpu_sampler" in run.extra:
            sampler = run.extra.pop("cpu_sampler")
            run.extra["cpu_s"] = sampler.stop(wait_children_s=30)
            run.extra["others_cores"] = sampler.others_cores
        if answer.get("checkpoint_bytes") is not None:
            run.extra["checkpoint_bytes"] = answer["checkpoint_bytes"]
        if answer.get("reason"):
            run.extra["reason"] = answer["reason"]
            if not run.status.endswith("COMPLETED"):
                self.log(f"  atoll: job {run.job_id} {run.status}: {answer['reason'][:300]}")

    def abort(self, run: JobRun) -> None:
        self._admin("job", "abort", run.job_id)

    def list_jobs(self) -> None:
        self._admin("job", "list")

    def stop_deployment(self) -> None:
        for site in SITES:
            self.run_cmd([self.atoll, "site", "stop", str(self.kits / site)], 60, check=False)
        self.run_cmd([self.atoll, "server", "stop", str(self.kits / "server")], 60, check=False)

    def is_job_process(self, cmdline: str) -> bool:
        return "-m atoll.worker" in cmdline

    # -- helpers -------------------------------------------------------------------------
    def _lend_marks(self, mark_dir: Path, name: str) -> None:
        """The job writes its marks into its folder of the deployment's marks dataset; the
        runner reads them at ``mark_dir``, made a link to that folder."""
        own = self.workdir / "lent-marks" / name
        own.mkdir(parents=True, exist_ok=True)
        if mark_dir.is_symlink() or (mark_dir.is_dir() and not any(mark_dir.iterdir())):
            mark_dir.unlink() if mark_dir.is_symlink() else mark_dir.rmdir()
        mark_dir.parent.mkdir(parents=True, exist_ok=True)
        mark_dir.symlink_to(own.resolve(), target_is_directory=True)

    def _map_marks(self, mark_dir: Path) -> None:
        mark_dir.mkdir(parents=True, exist_ok=True)
        doc = {
            "format_version": 2,
            "studies": {
                "default": {
                    "datasets": {MARKS_DATASET: {"source": str(mark_dir.resolve()), "mode": "rw"}}
                }
            },
        }
        for site in SITES:
            path = self.kits / site / "local" / "study_runtime.yaml"
            path.write_text(STUDY_RUNTIME.format(doc=json.dumps(doc, indent=1)))

    def _byte_compile(self) -> None:
        """atoll runs from an editable install (src/), the peers from wheels that pip
        byte-compiled at install. Compile src/ the same way (a no-op when up to date), or where
        PYTHONDONTWRITEBYTECODE is set every atoll process compiles atoll anew at each start."""
        if not AtollDriver._compiled:
            self.run_cmd([self.python, "-m", "compileall", "-q", str(REPO / "src")], timeout=300)
            AtollDriver._compiled = True


class WorkerAwareTable(ProcessTable):
    """The tagged processes plus their descendants.

    atoll's process launcher gives a job worker a clean environment (a fixed list of inherited
    variables, the job's identity, its study's env), so the harness tag does not reach the
    workers; they are found as children of the tagged parents instead (/proc/PID/task/*/children),
    and measured and stopped with them."""

    def scan(self, role: str | None = None) -> list[Proc]:
        tagged = super().scan()
        seen = {p.pid for p in tagged}
        found = [p for p in tagged if role is None or p.role == role]
        queue = [p.pid for p in tagged if p.role == "deployment"]
        while queue:
            for child in _children(queue.pop()):
                if child in seen:
                    continue
                seen.add(child)
                st = _stat(child)
                if st is None or st[0] == "Z":
                    continue
                queue.append(child)
                if role in (None, "deployment"):
                    found.append(Proc(child, st[2], "deployment"))
        return found


class CpuSampler:
    """CPU seconds a deployment spends on one job: its parents' own and reaped children's
    (utime + stime + cutime + cstime, before the submit and once every worker is reaped), plus
    the processes below the parents' children, sampled from /proc at `hz` (their last reading).

    Why both: a parent's cutime holds what its direct children used once it reaped them (the
    unconfined workers, the helpers it runs), but nothing of what runs inside bwrap: the
    sandboxed worker is a child of bwrap's own init, whose CPU time never reaches the parent
    (a child spinning 1 CPU-s under bwrap adds 0.002 s to its parent's RUSAGE_CHILDREN). Those
    are sampled; each may lose what it spent after its last sample (at most 1/hz s)."""

    def __init__(self, parents: list[int], hz: float = 20.0):
        self.machine0, self.t0 = _machine_busy(), time.monotonic()
        self.others_cores = None  # CPU cores the rest of the machine used meanwhile (stop())
        self.parents = {pid: _cpu_times(pid) for pid in parents}
        # each parent's long-lived signature verifier (pki/verifier.py): a child that outlives
        # the job, so its CPU time is taken from its own counters, not the parent's cutime
        self.verifiers = {pid: _cpu_times(pid) for pid in _verifiers(parents)}
        self.period = 1.0 / hz
        self.below: dict[tuple[int, int], float] = {}  # (pid, start) -> own CPU seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period)

    def _sample(self) -> None:
        queue = [c for pid in self.parents for c in _children(pid)  # parents' children: cutime
                 if c not in self.verifiers]
        queue = [g for c in queue for g in _children(c)]
        while queue:
            pid = queue.pop()
            times = _cpu_times(pid, start=True)
            if times is not None:
                own, _, start = times
                self.below[(pid, start)] = max(own, self.below.get((pid, start), 0.0))
            queue += _children(pid)

    def stop(self, wait_children_s: float = 0.0) -> float:
        """Stop sampling once the parents have no child left (or after wait_children_s);
        returns the job's CPU seconds."""
        deadline = time.monotonic() + wait_children_s
        verifiers = set(self.verifiers)
        while (any(set(_children(pid)) - verifiers for pid in self.parents)
               and time.monotonic() < deadline):
            time.sleep(0.02)  # a worker (or its zombie) is left: not in the parent's cutime yet
        self._stop.set()
        self._thread.join(timeout=5)
        total = sum(self.below.values())
        for pid, before in self.verifiers.items():
            after = _cpu_times(pid)
            if before is not None and after is not None:
                total += after[0] - before[0]
        for pid, before in self.parents.items():
            after = _cpu_times(pid)
            if before is not None and after is not None:
                total += sum(after[:2]) - sum(before[:2])
        busy, elapsed = _machine_busy() - self.machine0, time.monotonic() - self.t0
        if elapsed > 0:
            self.others_cores = max(0.0, busy - total) / elapsed
        return total


def _verifiers(parents: list[int]) -> list[int]:
    """The parents' signature verifiers (``python -P -m atoll.pki.verifier``)."""
    found = []
    for pid in parents:
        for child in _children(pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"atoll.pki.verifier" in cmdline:
                found.append(child)
    return found


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all CPUs, /proc/stat, idle and iowait
    left out)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def _cpu_times(pid: int, start: bool = False):
    """(own, reaped children's) CPU seconds of a process, and its start time when asked; None
    once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / _TICKS
    children = (int(fields[13]) + int(fields[14])) / _TICKS
    return (own, children, int(fields[19])) if start else (own, children)


_TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


# Run by the atoll venv's Python (PyYAML): sets process.<key> to <value> (argv) in one kit's
# local/site.yaml and keeps every other key. Without a process block the line is appended, so
# the file's comments stay; with one, the file is rewritten from its parsed document. Then the
# kit's local/ is checked and recorded as `atoll provision` does for the files it writes, so
# that this parent, like the sandboxed one, starts without checking local/ again.
_UNCONFINE = """\\
import sys, yaml
from pathlib import Path
from atoll.parent.local_config import record_local_config
kit, is_site, key, value = Path(sys.argv[1]), sys.argv[2] == "site", sys.argv[3], sys.argv[4]
path = kit / "local" / "site.yaml"
text = open(path).read()
doc = yaml.safe_load(text) or {}
if doc.get("launcher", "process") != "process":
    sys.exit(f"{path}: launcher is {doc['launcher']!r}, not process")
block = doc.get("process")
if block is None and "process" not in doc:
    text = text.rstrip("\\n") + f"\\n\\n# bench/compare: process.{key}: {value}\\n"
    text += f"process: {{{key}: {value}}}\\n"
else:
    if not isinstance(block, dict):
        sys.exit(f"{path}: process is {block!r}, not a mapping")
    doc["process"] = {**block, key: value}
    text = yaml.safe_dump(doc, sort_keys=False)
open(path, "w").write(text)
check = yaml.safe_load(open(path).read())
assert check["process"][key] == value, check
assert {k: v for k, v in check.items() if k != "process"} == \\
    {k: v for k, v in doc.items() if k != "process"}, check
record_local_config(kit / "local", is_site, kit / "workspace")
"""


class AtollUnconfinedDriver(AtollDriver):
    """atoll as above, but every worker (the server's and the sites') without the sandbox.

    Provisioned the same way, then `process: {sandbox: none}` is set in the server's and each
    site's local/site.yaml (the site operator's opt-out, issue 19), and the kit's record of
    its checked local/ (workspace/local-checked.json) is made again for the edited file, so
    both variants' parents start the same way.
    """

    name = "atoll-unconfined"
    title = "atoll, sandbox: none"
    setting = ("sandbox", "none")  # process.<key>: <value> in every kit's local/site.yaml

    def prepare(self) -> None:
        super().prepare()
        for kit in ("server", *SITES):
            site_yaml = self.kits / kit / "local" / "site.yaml"
            if not site_yaml.is_file():
                raise DriverError(f"{self.name}: provision made no {site_yaml}")
            role = "server" if kit == "server" else "site"
            self.run_cmd([self.python, "-c", _UNCONFINE, str(self.kits / kit), role,
                          *self.setting], timeout=60)


class AtollHostNetDriver(AtollUnconfinedDriver):
    """atoll with its workers under bwrap, but on the host's network (issue 32): the server's and
    each site's local/site.yaml get `process: {network: host}`, the opt-out of the workers' own
    network namespaces; compared with atoll, it is the network sandbox's cost."""

    name = "atoll-hostnet"
    title = "atoll, network: host"
    setting = ("network", "host")


class AtollNoProvenanceDriver(AtollDriver):
    """atoll with its parents started with ATOLL_BENCHMARK_NO_PROVENANCE=1 (issue 38): the
    server keeps no provenance record and the sites state no entries; compared with atoll, it
    is the record's cost. The server worker's round digests (one SHA-256 pass over each
    round's global model, job code's part) run in both variants."""

    name = "atoll-noprov"
    title = "atoll, no provenance"

    def system_env(self) -> dict[str, str]:
        return {**super().system_env(), "ATOLL_BENCHMARK_NO_PROVENANCE": "1"}


class AtollNoCheckpointDriver(AtollDriver):
    """atoll with its server parent started with ATOLL_BENCHMARK_NO_CHECKPOINT=1 (issue 37): the
    server workers keep no per-round checkpoint; compared with atoll, it is the checkpoint's
    cost (an atomic, fsynced write of the global model after each round)."""

    name = "atoll-nockpt"
    title = "atoll, no checkpoint"

    def system_env(self) -> dict[str, str]:
        return {**super().system_env(), "ATOLL_BENCHMARK_NO_CHECKPOINT": "1"}
