"""The contract every benchmarked system implements, and the helpers the drivers share.

A driver owns one system's deployment on this machine: it starts the server and two clients
as separate processes, says when they are ready, submits the benchmark job (numpy FedAvg over
a model of float32 layers), aborts, lists jobs and stops everything. The runner (run.py) does
the timing and the RSS sampling, so every system is measured by the same code.

Every process a driver starts goes through `spawn` / `run_cmd`, which tag it (see proctree):
that is how the runner finds the whole process tree, samples its RSS and guarantees that
nothing is left running.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from proctree import ROLE_VAR, TAG_VAR, ProcessTable

COMPARE_DIR = Path(__file__).resolve().parent.parent
REPO = COMPARE_DIR.parent.parent
VENVS = REPO / "bench" / ".venvs"
MAX_LAYER_ELEMS = 16 * 2**20  # 64 MiB float32 layers: a 1 GiB model has 16 of them


class DriverError(RuntimeError):
    """A step of a system failed; the message says which step and shows the tool's output."""


def layer_elems(model_mb: float) -> list[int]:
    """float32 element counts per layer for a model of model_mb MiB (identical everywhere)."""
    total = max(1, round(model_mb * 2**20 / 4))
    layers = [MAX_LAYER_ELEMS] * (total // MAX_LAYER_ELEMS)
    if total % MAX_LAYER_ELEMS:
        layers.append(total % MAX_LAYER_ELEMS)
    return layers


def llm_layer_bytes(model_mb: float, blocks: int = 24) -> list[int]:
    """Byte sizes of the tensors of a model shaped like a language model (issue 40): an
    embedding and an output head of 1/16 of the model each (512 MiB at 8 GiB), then ``blocks``
    transformer blocks of 4 attention matrices (1/10 of a block each), 3 MLP matrices (2/10
    each) and 4 small norms and biases (8 KiB), and a final norm: 267 tensors. Sizes are
    multiples of 4 bytes, so a peer without bf16 gets float32 tensors of the same byte sizes."""
    total = model_mb * 2**20
    small = 8192
    head = int(total / 16) // 4 * 4
    block = (total - 2 * head - small * (4 * blocks + 1)) / blocks
    attention, mlp = int(block / 10) // 4 * 4, int(block / 5) // 4 * 4
    sizes = [head]
    for _ in range(blocks):
        sizes += [small, attention, attention, attention, attention, small, mlp, mlp, mlp]
        sizes += [small, small]
    return [*sizes, small, head]


def layer_counts(model_mb: float, shape: str, itemsize: int = 4) -> list[int]:
    """Element counts per tensor: ``flat`` float32 layers, or ``llm`` (llm_layer_bytes) in
    elements of ``itemsize`` bytes (2 for atoll's bf16, 4 for a peer's float32)."""
    if shape == "flat":
        return layer_elems(model_mb)
    return [n // itemsize for n in llm_layer_bytes(model_mb)]


def free_port_block(count: int, start: int = 20000, stop: int = 40000) -> int:
    """First port p such that p .. p+count-1 are all free on 127.0.0.1."""
    for base in range(start, stop, count):
        ok = True
        for port in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise DriverError(f"no {count} consecutive free ports between {start} and {stop}")


def read_marks(mark_dir: Path) -> dict[int, float]:
    """Round -> earliest time any client received that round's model.

    Each system's client code appends "recv <round> <unix time>" lines to
    <mark_dir>/<site>.marks; the runner turns them into per-round times."""
    first: dict[int, float] = {}
    for path in mark_dir.glob("*.marks"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "recv":
                rnd, t = int(parts[1]), float(parts[2])
                first[rnd] = min(t, first.get(rnd, t))
    return first


@dataclass
class JobRun:
    """What one submitted job did, as observed from outside."""

    job_id: str
    submitted_at: float  # just before the submit command started
    finished_at: float | None = None  # when the system first reported it finished
    status: str = ""
    extra: dict = field(default_factory=dict)


CLIENTS = 2  # every system runs a server and two clients


class Watcher:
    """A system's own status poller (its ctl.py ``armed-ready`` / ``armed-wait``), started before
    the clock starts and armed: its interpreter, its imports and (to wait for a job) its
    connection are done when ``armed`` returns. What is timed is then the system's own work, not
    the start of the harness's poller on the same two cores (about 0.3 CPU-s for each system's
    client libraries, which a 1-2 s job would otherwise share its cores with). ``go`` hands it
    the job (or the number of sites) and waits for its answer."""

    def __init__(self, driver: Driver, argv: list[str], arm_timeout: float = 120):
        self.driver = driver
        self.proc = subprocess.Popen(argv, env=driver.env("admin"), cwd=driver.workdir,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline, seen = time.monotonic() + arm_timeout, []
        while not seen or '"armed"' not in seen[-1]:  # a client library may print first
            ready, _, _ = select.select([self.proc.stdout], [], [],
                                        max(0.0, deadline - time.monotonic()))
            line = self.proc.stdout.readline() if ready else ""
            if not line:  # timed out, or the poller ended
                self.drop()
                raise DriverError(f"{driver.name}: the poller did not arm in {arm_timeout} s: "
                                  f"{_tail(''.join(seen))} {_tail(self.proc.stderr.read())}")
            seen.append(line)

    def go(self, arg: str, timeout: float) -> dict:
        try:
            out, err = self.proc.communicate(f"{arg} {timeout}\n", timeout=timeout + 30)
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            self.drop()
            return {"error": f"the poller: {exc}"}
        for line in reversed(out.strip().splitlines()):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict):
                return answer
        return {"error": _tail(err, 800)}

    def drop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Driver(ABC):
    """One system under test. Subclasses set `name` (CLI id) and `title` (table column)."""

    name = ""
    title = ""

    def __init__(self, workdir: Path, tag: str, log=print):
        self.workdir = workdir
        self.tag = tag
        self.log = log
        self.table = ProcessTable(tag)
        self._children: list[subprocess.Popen] = []
        self._logs: list = []

    # -- the contract ------------------------------------------------------------------
    @abstractmethod
    def missing(self) -> str | None:
        """None when the system can run here, else what to do first (e.g. run setup)."""

    @abstractmethod
    def prepare(self) -> None:
        """Provision a fresh deployment under self.workdir (not timed)."""

    @abstractmethod
    def start_deployment(self) -> None:
        """Start server and two clients as separate processes; return without waiting."""

    def wait_ready(self, watcher: Watcher, timeout: float) -> float:
        """Block until the server accepts admin calls and both clients are connected, as the
        ``watcher`` armed before the deployment started (``self.watcher("ready")``) sees it;
        return when it saw them (its clock, ``time.time()``), as a job's end is taken: not
        when the poller's own process has closed its connection and exited."""
        answer = watcher.go(str(CLIENTS), timeout)
        if not answer.get("ready"):
            raise DriverError(f"{self.name}: not ready in {timeout} s: {answer}; see "
                              f"{self.workdir}/*.log")
        return float(answer.get("t") or time.time())

    @abstractmethod
    def prepare_job(
        self, model_mb: float, rounds: int, mark_dir: Path, shape: str = "flat"
    ) -> object:
        """Build the job (not timed); returns whatever submit() needs."""

    @abstractmethod
    def submit(self, job: object) -> JobRun:
        """Submit with the system's own admin tool; returns once the system accepted it. The
        job's poller is armed first (``run.extra["watcher"]``, before ``submitted_at``)."""

    def forget(self, run: JobRun) -> None:
        """Stop the run's poller: a job that is aborted, not waited for."""
        watcher = run.extra.pop("watcher", None)
        if watcher is not None:
            watcher.drop()

    @abstractmethod
    def wait_finished(self, run: JobRun, timeout: float) -> None:
        """Block until the system reports the job finished; sets run.finished_at/status."""

    @abstractmethod
    def abort(self, run: JobRun) -> None:
        """Abort a running job with the system's own admin tool."""

    @abstractmethod
    def list_jobs(self) -> None:
        """One admin command that lists jobs, as a user runs it (a fresh CLI process)."""

    @abstractmethod
    def stop_deployment(self) -> None:
        """Stop the deployment the way its documentation says (the runner kills leftovers)."""

    @abstractmethod
    def is_job_process(self, cmdline: str) -> bool:
        """True for a per-job process (server or client job worker), not a long-lived one."""

    def watcher(self, verb: str) -> Watcher:
        """This system's poller for ``verb`` (``ready`` or ``wait``), armed (``Watcher``)."""
        return Watcher(self, self.watcher_argv(f"armed-{verb}"))

    @abstractmethod
    def watcher_argv(self, verb: str) -> list[str]:
        """The argv of this system's ctl.py for ``verb`` (``armed-ready`` / ``armed-wait``)."""

    # -- convenience built on the contract ---------------------------------------------
    def submit_and_wait(
        self, model_mb: float, rounds: int, mark_dir: Path, timeout: float
    ) -> JobRun:
        run = self.submit(self.prepare_job(model_mb, rounds, mark_dir))
        self.wait_finished(run, timeout)
        return run

    def deployment_pids(self) -> list[int]:
        return [p.pid for p in self.table.scan("deployment")]

    def job_processes(self) -> list[int]:
        return [p.pid for p in self.table.scan("deployment") if self.is_job_process(p.cmdline)]

    # -- process helpers -----------------------------------------------------------------
    def env(self, role: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.update(self.system_env())
        env[TAG_VAR] = self.tag
        env[ROLE_VAR] = role
        return env

    def system_env(self) -> dict[str, str]:
        """Variables every process of this system gets (PATH to its venv, config homes)."""
        return {}

    def spawn(
        self, argv: list[str], log_name: str, role: str = "deployment", cwd: Path | None = None
    ) -> subprocess.Popen:
        logf = open(self.workdir / log_name, "ab")
        self._logs.append(logf)
        proc = subprocess.Popen(
            argv,
            env=self.env(role),
            cwd=cwd or self.workdir,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._children.append(proc)
        return proc

    def run_cmd(
        self,
        argv: list[str],
        timeout: float,
        role: str = "admin",
        cwd: Path | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        try:
            res = subprocess.run(
                argv,
                env=self.env(role),
                cwd=cwd or self.workdir,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise DriverError(
                f"{self.name}: `{' '.join(argv)}` timed out after {timeout} s; "
                f"output: {_tail(exc.stdout)} {_tail(exc.stderr)}"
            ) from None
        if check and res.returncode != 0:
            raise DriverError(
                f"{self.name}: `{' '.join(argv)}` exited {res.returncode}: "
                f"{_tail(res.stdout)} {_tail(res.stderr)}"
            )
        return res

    def cleanup(self) -> list[str]:
        """Kill whatever of this system is still running; returns what had to be killed."""
        leftovers = self.table.kill_all()
        for proc in self._children:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._children.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()
        return leftovers


def _tail(text, n: int = 600) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def wait_until(predicate, timeout: float, period: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(period)
    raise DriverError(f"timed out after {timeout} s waiting for {what}")
