"""The process launcher (embedded default): the worker is a child process of the parent.

- Own session and process group (``start_new_session``), so cancel reaches the whole tree.
- GPUs: ``num_of_gpus`` exclusive ids from ``process.gpu_ids`` as ``CUDA_VISIBLE_DEVICES``
  (an empty value when the job asks none, so it sees no GPU); never two jobs on one GPU.
- CPUs: ``num_of_cpus`` as CPU affinity, the host's least-used CPUs (see process_allocation.py), and as
  ``OMP_NUM_THREADS`` unless the study's env sets it.
- Memory: a cgroup limit where the host allows one, else ``RLIMIT_AS`` (process_memory_limit.py).
- Confinement (``process.sandbox: bwrap``, the default): the worker runs under bubblewrap and
  sees only its run folder, its study's datasets at ``/data/<study>/<dataset>``, its Python
  runtime and its own processes (process_sandbox.py). ``sandbox: none`` is the site's explicit
  opt-out: the worker then runs with the parent's privileges.
- Network (``process.network``, isolated by default): the sandbox has a network namespace of
  its own; the worker dials its parent's unix socket, bound in, and the destinations the site
  allows through relays (process_network.py). ``network: host`` (and ``sandbox: none``) is the
  opt-out: the worker dials its parent on TCP and reaches what the host reaches.
- Several processes (``processes_per_node`` > 1; N GPUs alone are one process that sees them): the worker starts the other
  ranks in its sandbox, one GPU each (launchers/ranks.py, worker/local_ranks.py).
- Environment: atoll's variables, the study's ``env``, ``ATOLL_DATASETS`` (JSON name -> path),
  a few harmless variables of the parent (PATH, locale...: ``inherited_env``, the one read of
  the parent's environment in the launchers). Never the parent's whole environment: it may hold
  other studies' secrets.
- Credentials (job token, secret_env values) go through a pipe the worker reads once
  (``ATOLL_CREDENTIALS_FD``), never an environment block that ``/proc`` shows.
- stdout and stderr go to ``<workdir>/logs/worker.log``.

Child setup (affinity, cgroup, rlimit) runs in ``preexec_fn`` between fork and exec; it only
makes plain system calls, no imports or locks, which keeps it safe in the threaded parent.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from atoll.launchers.base import (
    RENDER_DIGEST,
    Handle,
    Launcher,
    LaunchError,
    LaunchRequest,
    Outcome,
    ProgressCallback,
    WorkerExit,
    check_identity,
    render_digest,
)
from atoll.launchers.job_files import JobFileError, create_job_file
from atoll.launchers.lent_folders import refuse_parent_folders
from atoll.launchers.process_allocation import CpuAllocator, GpuAllocator, HostCpuLeases
from atoll.launchers.process_group import (
    INHERITED_ENV,
    CredentialsTooLarge,
    credentials_pipe,
    inherited_env,
    kill_group,
    signal_text,
    wait_group_gone,
)
from atoll.launchers.process_memory_limit import MemoryCgroup, create_memory_cgroup
from atoll.launchers.process_network import FORWARD_ENV, Relays, forward_spec, relay_socket
from atoll.launchers.process_options import ProcessOptions
from atoll.launchers.process_sandbox import (
    SANDBOX_TMP,
    Mount,
    SandboxHost,
    SandboxNetwork,
    SandboxUnavailable,
    bwrap_binary,
    probe_host,
    runtime_overlaps,
    sandbox_argv,
)
from atoll.launchers.ranks import processes_per_node, single_node_rendezvous
from atoll.spec import worker_env
from atoll.spec.study_runtime_plain import dataset_mount_path

LOG_FILE = Path("logs") / "worker.log"
MemoryMode = Literal["auto", "cgroup", "rlimit"]
CREDENTIALS_FD_ENV = worker_env.CREDENTIALS_FD
# What a render shows before the parent has its socket and relays (atoll site render).
PARENT_SOCKET_PREVIEW = "<the parent's worker socket>"
RELAY_FOLDER_PREVIEW = "<the parent's relay folder>"


@dataclass
class _Running:
    key: str
    popen: subprocess.Popen
    gpus: list[str]
    cpus: list[int]
    memory: str | None
    cgroup: MemoryCgroup | None
    rlimit: bool
    log: Path
    sandboxed: bool
    cancelled: bool = False
    finished: bool = False


def _options_of(site_config: Any) -> ProcessOptions:
    from atoll.spec.site_config import ProcessSettings

    settings = site_config.settings if site_config is not None else ProcessSettings()
    if not isinstance(settings, ProcessSettings):
        raise LaunchError(f"site.yaml chooses launcher {site_config.launcher}, not process")
    return ProcessOptions.of(settings)


def credential_names(request: LaunchRequest) -> list[str]:
    """Names (never values) the child gets from the parent's secret channel at launch."""
    entry = request.study_runtime
    secret = [n for n, ref in entry.secret_env.items() if ref.source == "env"] if entry else []
    return sorted({*request.credentials, worker_env.JOB_TOKEN, *secret})


class ProcessLauncher(Launcher):
    name: ClassVar[str] = "process"
    shares_host: ClassVar[bool] = True

    def __init__(
        self,
        site_config: Any = None,
        *,
        cpus: list[int] | None = None,
        share_cpus: bool = True,
        parent_pid: int | None = None,
        memory_mode: MemoryMode = "auto",
        grace_s: float = 3.0,
        sandbox_host: SandboxHost | None = None,
        options: ProcessOptions | None = None,
    ) -> None:
        """From site.yaml's SiteConfig, or from ``options`` (what the check of local/ found in
        its process: block; then no SiteConfig, so no model, is needed)."""
        if options is None:
            options = _options_of(site_config)
        self._python = options.python or sys.executable
        self._gpus = GpuAllocator(list(options.gpu_ids))
        host_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        # share_cpus: count the workers that other parents of this user pinned on this host.
        self._cpus = CpuAllocator(cpus if cpus is not None else (list(options.cpu_ids)
                                                                 or host_cpus),
                                  HostCpuLeases.for_host() if share_cpus else None)
        self._parent_pid = parent_pid if parent_pid is not None else os.getpid()
        self._memory_mode = memory_mode
        self._grace_s = grace_s
        self.sandboxed = options.sandboxed
        self.isolated = options.isolated
        self._allow = list(options.allow) if self.isolated else []
        self._destinations = [tuple(d) for d in options.destinations] if self.isolated else []
        self._relays: Relays | None = None  # started at the first launch that needs them
        self._bwrap = options.bwrap
        self._sandbox_host = sandbox_host
        self._jobs: dict[str, _Running] = {}
        self._lock = threading.Lock()

    def sandbox_host(self) -> SandboxHost:
        """This host's sandbox facts, probed once (a LaunchError says how to opt out)."""
        if self._sandbox_host is None:
            try:
                self._sandbox_host = probe_host(self._python, bwrap_binary(self._bwrap))
            except SandboxUnavailable as exc:
                raise LaunchError(str(exc)) from None
        return self._sandbox_host

    # ----- pure -----------------------------------------------------------------------------

    def render(
        self,
        request: LaunchRequest,
        gpu_ids: list[str] | None = None,
        cpus: list[int] | None = None,
    ) -> dict[str, Any]:
        """argv, environment (no credentials), folder and limits of the worker process.

        Without ``gpu_ids``/``cpus`` it shows what a launch would pick now (nothing is taken).
        """
        check_identity(request.identity)  # its ids name the worker's cgroup and allocations
        res = request.resources
        gpus = gpu_ids if gpu_ids is not None else self._gpus.preview(res.num_of_gpus)
        if cpus is None and self._cpus.cpus:
            cpus = self._cpus.preview(res.cpus_counted)
        entry = request.study_runtime
        env = dict(request.worker_env)
        env.update(entry.env if entry is not None else {})
        env[worker_env.WORKDIR] = str(request.workdir)
        if self.sandboxed:  # its own /tmp and home; bwrap ties it to its parent's life
            env["HOME"] = env["TMPDIR"] = SANDBOX_TMP
        else:
            env[worker_env.PARENT_PID] = str(self._parent_pid)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        processes = processes_per_node(request, res.num_of_gpus)
        env.update(single_node_rendezvous(processes))
        # Math libraries (OpenMP, BLAS, PyTorch) size their thread pools from the host's cores,
        # not from the CPUs the worker is pinned to; oversubscribed, a small model runs 10x
        # slower. The study's env may still choose otherwise.
        env.setdefault("OMP_NUM_THREADS", str(max(1, res.cpus_counted // processes)))
        _refuse_parent_datasets(request)
        mounts = dataset_mounts(request) if self.sandboxed else ()
        if entry is not None and entry.datasets:
            datasets = {name: d.source for name, d in sorted(entry.datasets.items())}
            if self.sandboxed:
                datasets = {name: m.target for name, m in zip(sorted(entry.datasets), mounts,
                                                               strict=True)}
            env[worker_env.DATASETS] = json.dumps(datasets, sort_keys=True)
        network = self._network(request, env)
        argv = [self._python, *request.worker_args]
        if self.sandboxed:
            app = request.workdir / "app"
            argv = [*sandbox_argv(self.sandbox_host(), run_folder=str(request.workdir),
                                  app_folder=str(app), shared=tuple(map(str,
                                                                        request.shared_folders)),
                                  datasets=mounts, gpu_ids=gpus, network=network), *argv]
        return {
            "argv": argv,
            "sandbox": "bwrap" if self.sandboxed else "none",
            "network": "isolated" if self.isolated else "host",
            "network_allow": list(self._allow),
            "env": dict(sorted(env.items())),
            "inherited_env": list(INHERITED_ENV),
            "credential_env": credential_names(request),
            "cwd": str(request.workdir),
            "start_new_session": True,
            "cpu_affinity": cpus or None,
            "memory_limit_bytes": res.memory_bytes,
            "gpu_ids": gpus,
            "log_file": str(request.workdir / LOG_FILE),
        }

    def _network(self, request: LaunchRequest, env: dict[str, str]) -> SandboxNetwork | None:
        """The worker's own network namespace (None: the host's); sets how it dials its parent
        (the bound unix socket, no TLS) and what its forwarder relays."""
        if not self.isolated:
            return None
        parent = request.parent_socket or PARENT_SOCKET_PREVIEW
        env[worker_env.PARENT] = f"unix:{parent}"
        env.pop(worker_env.PARENT_CERT, None)
        sockets = [parent]
        hosts = None
        if self._destinations:
            folder = self._relays.folder if self._relays is not None else RELAY_FOLDER_PREVIEW
            env[FORWARD_ENV] = forward_spec(self._destinations, folder)
            sockets += [relay_socket(folder, i) for i in range(len(self._destinations))]
            hosts = self._relays.hosts_file if self._relays is not None else None
        return SandboxNetwork(tuple(sockets), hosts)

    def _start_relays(self, request: LaunchRequest) -> None:
        if request.parent_socket is None:
            raise LaunchError("this parent has no unix socket for its workers, which a worker "
                              "with a network of its own needs; set process.network: host in "
                              "local/site.yaml to let workers dial it on TCP")
        with self._lock:
            if self._destinations and self._relays is None:
                try:
                    self._relays = Relays(self._destinations)
                except OSError as exc:
                    raise LaunchError(f"cannot open the relays of process.network.allow: "
                                      f"{exc}") from None

    # ----- I/O ------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest, on_progress: ProgressCallback | None = None) -> Handle:
        ident = check_identity(request.identity)
        key = f"{ident.job_id}/{ident.site}"
        with self._lock:
            if key in self._jobs and not self._jobs[key].finished:
                raise LaunchError(f"a worker for job {ident.job_id} at {ident.site} is running")
        res = request.resources
        gpus = self._gpus.allocate(key, res.num_of_gpus)
        cpus = self._cpus.allocate(key, res.cpus_counted) if self._cpus.cpus else []
        cgroup = None
        try:
            if self.sandboxed:
                self._check_mounts(request)
            if self.isolated:
                self._start_relays(request)
            spec = self.render(request, gpu_ids=gpus, cpus=cpus)
            cgroup, rlimit = self._memory_limit(request, spec["memory_limit_bytes"])
            popen = self._spawn(spec, request.credentials, cpus, cgroup, rlimit)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            self._release(key)
            raise
        run = _Running(key, popen, gpus, cpus, res.memory, cgroup, rlimit is not None,
                       Path(spec["log_file"]), self.sandboxed)
        with self._lock:
            self._jobs[key] = run
        if on_progress is not None:
            on_progress(f"worker process {popen.pid} started")
        return Handle(
            self.name,
            str(popen.pid),
            ident.job_id,
            extra={
                "key": key,
                "pgid": popen.pid,
                "gpu_ids": gpus,
                "cpu_affinity": cpus,
                "memory_limit": cgroup.kind if cgroup else ("rlimit-as" if rlimit else None),
                "log_file": spec["log_file"],
                "sandbox": spec["sandbox"],
                RENDER_DIGEST: render_digest(spec),  # argv, environment (no secret), limits
            },
        )

    def _check_mounts(self, request: LaunchRequest) -> None:
        """What bwrap would stumble on, said in the site's own terms before it runs."""
        overlap = runtime_overlaps(self.sandbox_host(), str(request.workdir))
        if overlap is not None:
            raise LaunchError(f"the worker's Python runtime folder {overlap} holds the job's run "
                              f"folder; move the workspace (process.workdir in local/site.yaml) "
                              "out of it, or it would be lent to the job")
        entry = request.study_runtime
        for name, dataset in sorted((entry.datasets if entry else {}).items()):
            if not os.path.isdir(dataset.source):
                raise LaunchError(f"dataset {name} of study {request.identity.study}: "
                                  f"{dataset.source} is not a folder on this host "
                                  "(local/study_runtime.yaml)")

    def _memory_limit(
        self, request: LaunchRequest, limit: int | None
    ) -> tuple[MemoryCgroup | None, int | None]:
        if limit is None:
            return None, None
        cgroup = None
        if self._memory_mode != "rlimit":
            ident = request.identity
            cgroup = create_memory_cgroup(f"atoll-{ident.site}-{ident.job_id}", limit)
            if cgroup is None and self._memory_mode == "cgroup":
                raise LaunchError("no writable memory cgroup on this host for a hard memory limit")
        return cgroup, (None if cgroup is not None else limit)

    def _spawn(
        self,
        spec: dict[str, Any],
        credentials: Any,
        cpus: list[int],
        cgroup: MemoryCgroup | None,
        rlimit: int | None,
    ) -> subprocess.Popen:
        env = inherited_env()
        env.update(spec["env"])
        log_file = Path(spec["log_file"])
        log_file.parent.mkdir(parents=True, exist_ok=True)
        procs_file = cgroup.procs_file if cgroup is not None else None

        def child_setup() -> None:  # runs in the child between fork and exec
            if cpus:
                os.sched_setaffinity(0, cpus)
            if procs_file is not None:
                fd = os.open(procs_file, os.O_WRONLY)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
            if rlimit is not None:
                resource.setrlimit(resource.RLIMIT_AS, (rlimit, rlimit))

        try:
            cred_fd = credentials_pipe(credentials)
        except CredentialsTooLarge as exc:
            raise LaunchError(str(exc)) from None
        env[CREDENTIALS_FD_ENV] = str(cred_fd)
        try:
            # The log is the parent's to create, never through a link planted in the folder.
            with create_job_file(Path(spec["cwd"]), LOG_FILE) as log:
                return subprocess.Popen(
                    spec["argv"],
                    env=env,
                    cwd=spec["cwd"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(cred_fd,),
                    preexec_fn=child_setup,
                )
        except JobFileError as err:
            raise LaunchError(f"cannot create the worker's log: {err}") from err
        except (OSError, subprocess.SubprocessError) as err:
            raise LaunchError(f"cannot start the worker {spec['argv'][0]!r}: {err}") from err
        finally:
            os.close(cred_fd)  # the child holds its own copy; its read end is its alone

    def wait(self, handle: Handle) -> WorkerExit:
        run = self._run_of(handle)
        if run is None:
            return WorkerExit(Outcome.FAILED, f"no worker {handle.native_id} was started here")
        code = run.popen.wait()
        result = self._exit_of(run, code)
        self._finish(run)
        return result

    def _exit_of(self, run: _Running, code: int) -> WorkerExit:
        if run.cancelled:
            return WorkerExit(Outcome.ABORTED, "cancelled", code)
        if code == 0:
            return WorkerExit(Outcome.COMPLETED, "worker exited with code 0", 0)
        if run.sandboxed and code > 128:  # bwrap reports a signal N as 128 + N
            code = -(code - 128)
        what = f"killed by {signal_text(-code)}" if code < 0 else f"worker exited with code {code}"
        if run.cgroup is not None and run.cgroup.oom_killed():
            return WorkerExit(Outcome.FAILED, f"out of memory (limit {run.memory}): {what}", code)
        if run.rlimit and code > 0 and _log_mentions(run.log, b"MemoryError"):
            reason = f"out of memory (address-space limit {run.memory}): {what} after a MemoryError"
            return WorkerExit(Outcome.FAILED, reason, code)
        return WorkerExit(Outcome.FAILED, f"{what}; see the job's logs (atoll job logs {run.key.partition('/')[0]})", code)

    def cancel(self, handle: Handle) -> None:
        run = self._run_of(handle)
        if run is None or run.finished:
            return  # already gone: counts as cancelled
        run.cancelled = True
        kill_group(run.popen.pid, signal.SIGTERM)
        try:
            run.popen.wait(timeout=self._grace_s)
        except subprocess.TimeoutExpired:
            kill_group(run.popen.pid, signal.SIGKILL)
            run.popen.wait()
        self._finish(run)

    def close(self) -> None:
        with self._lock:
            running = [r for r in self._jobs.values() if not r.finished]
        for run in running:
            self.cancel(Handle(self.name, str(run.popen.pid), "", extra={"key": run.key}))
        if self._relays is not None:
            self._relays.close()
            self._relays = None

    def _run_of(self, handle: Handle) -> _Running | None:
        with self._lock:
            return self._jobs.get(handle.extra.get("key", ""))

    def _finish(self, run: _Running) -> None:
        """Once per worker: end stragglers of its group and cgroup, free its GPUs and CPUs."""
        with self._lock:
            if run.finished:
                return
            run.finished = True
        kill_group(run.popen.pid, signal.SIGKILL)
        wait_group_gone(run.popen.pid)
        if run.cgroup is not None:
            run.cgroup.kill_all()
            run.cgroup.remove()
        self._release(run.key)

    def _release(self, key: str) -> None:
        self._gpus.release(key)
        self._cpus.release(key)


def _refuse_parent_datasets(request: LaunchRequest) -> None:
    """No dataset is, holds or lies inside the kit (nor holds every run folder): the Docker
    launcher's rule, shared (launchers/lent_folders.py), sandboxed or not."""
    entry, study = request.study_runtime, request.identity.study
    for name, dataset in sorted((entry.datasets if entry else {}).items()):
        refuse_parent_folders(PurePosixPath(dataset.source), request,
                              f"studies.{study}.datasets.{name}.source")


def dataset_mounts(request: LaunchRequest) -> tuple[Mount, ...]:
    """The study's datasets at ``/data/<study>/<dataset>``, in name order, with their mode."""
    entry, study = request.study_runtime, request.identity.study
    return tuple(Mount(d.source, dataset_mount_path(study, name), d.mode == "rw")
                 for name, d in sorted((entry.datasets if entry else {}).items()))


def _log_mentions(path: Path, needle: bytes, tail: int = 64 * 1024) -> bool:
    # `path` is <run folder>/logs/worker.log, the job's own file: read without following a link.
    from atoll.launchers.job_files import read_tail

    try:
        return needle in read_tail(path.parents[len(LOG_FILE.parts) - 1], LOG_FILE, tail)
    except OSError:
        return False
