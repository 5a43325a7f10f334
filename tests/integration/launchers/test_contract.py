"""The launcher contract (launchers/base.py), once, against every launcher on its real engine.

Each property runs for the process launcher (always), Docker (scripts/backends/docker.sh), Kubernetes
(scripts/backends/k8s.sh) and Slurm (scripts/backends/slurm.sh); a backend's cases carry its
marker (``-m docker``...), skip when it is down, and fail instead under ``CI=true``.

- render is deterministic (same request, same render: twice, and from another launcher) and holds
  no credential value;
- launch -> wait: COMPLETED for a worker that exits 0, FAILED with the code for one that exits 3,
  with the worker's output in its log and nothing of the worker left;
- cancel is prompt and idempotent: a sleeping worker is gone after cancel, a wait blocked on it
  returns ABORTED, and cancel again (and after the end) changes nothing;
- cancel of a handle the launcher never started (a restarted parent's) is a no-op;
- num_of_cpus, memory and num_of_gpus show in the backend's own fields of the render.

No time is asserted: a worker that must end is waited for until it has (with a generous guard
against a hang), and how long it took is printed (run with -s to see it).

What only one backend has (sandbox, mounts, images, quotas, partitions, OOM kills...) stays in its
own file: tests/integration/test_process_launcher.py, docker/test_docker_launcher.py,
k8s/test_kubernetes_launcher.py, slurm/test_slurm_launcher.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from atoll.launchers.base import (
    RENDER_DIGEST,
    Handle,
    JobIdentity,
    Launcher,
    LaunchRequest,
    Outcome,
    render_digest,
)
from atoll.launchers.request import worker_env
from atoll.spec.quantity import memory_to_bytes
from atoll.spec.resources import Resources

# Every backend runs these Python programs (Kubernetes in the job image of k8s.sh).
EXIT_0 = "print('worker done', flush=True)"
EXIT_3 = "import sys; print('bad input', flush=True); sys.exit(3)"
SLEEP = "import time; print('started', flush=True); time.sleep(300)"

LAUNCHED = Resources(num_of_cpus=1, memory="256Mi", num_of_gpus=0)
# Not a time limit under test: how long a worker that must end may take before the test says
# it hangs.
GUARD_S = 90.0


@dataclasses.dataclass
class Backend:
    """One launcher on its real engine, and how the contract looks at its workers."""

    name: str
    launcher: Launcher
    fresh: Callable[[], Launcher]  # another launcher on the same site (a restarted parent)
    request: Callable[[Path, str, Resources], LaunchRequest]  # `python -c program` in workdir
    running: Callable[[Handle, Path, list[str]], bool]  # the worker runs (progress notes given)
    gone: Callable[[Handle, Path], bool]  # nothing of the worker is left on the engine
    log: Callable[[Handle, Path], str]  # the worker's output as the launcher saved it
    resources_in: Callable[[dict[str, Any]], tuple[int, int | None, int]]  # from native fields
    never_started: Callable[[], Handle]  # a handle of this backend's shape for no worker
    # A bystander on the same engine (a live process, container, pod or batch job that no
    # launcher here started) is still running: cancelling a handle of no worker touched nothing.
    untouched: Callable[[], bool]


def eventually(check: Callable[[], bool], what: str) -> float:
    """Seconds until ``check()`` holds; fails only if it never does (GUARD_S)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < GUARD_S, f"{what}: still not so after {GUARD_S} s"
        time.sleep(0.05)
    return time.monotonic() - start


def _token() -> str:
    return f"token-{uuid.uuid4().hex}"


def _closing(launchers: list[Launcher], make: Callable[[], Launcher]) -> Callable[[], Launcher]:
    def fresh() -> Launcher:
        launchers.append(make())
        return launchers[-1]

    return fresh


# -- process ----------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][0] != "Z"  # a zombie counts as gone
    except FileNotFoundError:
        return False


def _pids_of(workdir: Path) -> list[int]:
    """Processes whose environment names this run folder (as the host numbers them)."""
    marker = f"ATOLL_WORKDIR={workdir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                if _alive(int(entry.name)):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _process(launchers: list[Launcher], stack: list[Callable[[], None]]) -> Backend:
    from atoll.launchers.process import ProcessLauncher
    from atoll.spec.site_config import parse_site_config

    config = parse_site_config({"launcher": "process",
                                "process": {"gpu_ids": ["fake-0", "fake-1"]}})  # bwrap sandbox
    host = sorted(os.sched_getaffinity(0))
    # Its own CPUs only: other atoll parents on this machine must not change what it renders.
    fresh = _closing(launchers, lambda: ProcessLauncher(config, cpus=host, share_cpus=False))
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    def stop_bystander() -> None:
        bystander.kill()
        bystander.wait()

    stack.append(stop_bystander)

    # The parent's unix socket, bound into each worker's network namespace (never dialled here)
    sockets = Path(tempfile.mkdtemp(prefix="atoll-contract-"))
    parent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    parent.bind(str(sockets / "parent.sock"))
    stack.append(parent.close)
    stack.append(lambda: shutil.rmtree(sockets, ignore_errors=True))

    def request(workdir: Path, program: str, resources: Resources) -> LaunchRequest:
        identity = JobIdentity(uuid.uuid4().hex, "contract", "study", "site-a", "site")
        return LaunchRequest(
            identity=identity, resources=resources, launcher_spec={}, study_runtime=None,
            site_config=config, workdir=workdir, parent_address="127.0.0.1:9",
            parent_socket=str(sockets / "parent.sock"),
            worker_env=worker_env(identity, "127.0.0.1:9"),
            credentials={"ATOLL_JOB_TOKEN": _token()}, worker_args=("-c", program))

    def log(handle: Handle, workdir: Path) -> str:
        path = workdir / "logs" / "worker.log"
        return path.read_text() if path.exists() else ""

    def resources_in(rendered: dict[str, Any]) -> tuple[int, int | None, int]:
        return (len(rendered["cpu_affinity"] or []), rendered["memory_limit_bytes"],
                len(rendered["gpu_ids"]))

    return Backend(
        name="process",
        launcher=fresh(),
        fresh=fresh,
        request=request,
        running=lambda handle, workdir, notes: "started" in log(handle, workdir),
        gone=lambda handle, workdir: not _alive(int(handle.native_id)) and not _pids_of(workdir),
        log=log,
        resources_in=resources_in,
        # A live process of someone else, named by a handle no launcher here started.
        never_started=lambda: Handle("process", str(bystander.pid), uuid.uuid4().hex,
                                     extra={"key": f"{uuid.uuid4().hex}/site-a"}),
        untouched=lambda: _alive(bystander.pid),
    )


# -- docker -----------------------------------------------------------------------------------


def _docker(engine: Any, launchers: list[Launcher], stack: list[Callable[[], None]]) -> Backend:
    import docker
    from atoll.launchers.docker import DockerLauncher
    from tests.integration.docker.conftest import (
        SESSION_ID,
        SESSION_LABEL,
        make_request,
        site_config,
    )

    config = site_config(engine, gpu_ids=["0", "1"])  # what the 1-GPU render reserves from
    fresh = _closing(launchers, lambda: DockerLauncher(config))
    bystander: list[Any] = []  # a container of someone else, started with never_started's

    def never_started() -> Handle:
        bystander.append(engine.client.containers.run(
            engine.env["ATOLL_TEST_BUSYBOX_IMAGE"], ["sleep", "600"], detach=True,
            labels={"atoll.test": "1", SESSION_LABEL: SESSION_ID}))
        stack.append(lambda: bystander[0].remove(force=True))
        return Handle("docker", uuid.uuid4().hex * 2, uuid.uuid4().hex)

    def bystander_runs() -> bool:
        bystander[0].reload()
        return bystander[0].status == "running"

    def request(workdir: Path, program: str, resources: Resources) -> LaunchRequest:
        return make_request(workdir, program, site_config=config, resources=resources)

    def container_logs(handle: Handle) -> bytes:
        try:
            return engine.client.containers.get(handle.native_id).logs()
        except docker.errors.NotFound:
            return b""

    def gone(handle: Handle, workdir: Path) -> bool:
        try:
            engine.client.containers.get(handle.native_id)
        except docker.errors.NotFound:
            return True
        return False

    def resources_in(rendered: dict[str, Any]) -> tuple[int, int | None, int]:
        run = rendered["containers.run"]
        return (run["nano_cpus"] // 1_000_000_000, run.get("mem_limit"),
                sum(len(d["device_ids"]) for d in run["device_requests"]))

    return Backend(
        name="docker",
        launcher=fresh(),
        fresh=fresh,
        request=request,
        running=lambda handle, workdir, notes: b"started" in container_logs(handle),
        gone=gone,
        log=lambda handle, workdir: (workdir / "logs" / "worker.log").read_text(),
        resources_in=resources_in,
        never_started=never_started,
        untouched=bystander_runs,
    )


# -- Kubernetes -------------------------------------------------------------------------------


def _k8s(cluster: Any, launchers: list[Launcher], stack: list[Callable[[], None]]) -> Backend:
    from kubernetes.client.exceptions import ApiException

    import docker
    from tests.integration.k8s.conftest import make_launcher, make_request

    fresh = _closing(launchers, lambda: make_launcher(cluster, python="python3",
                                                      default_image=cluster.job_image))
    node = docker.DockerClient(base_url=cluster.env["ATOLL_K8S_DOCKER_HOST"])  # the kubelet's
    stack.append(node.close)
    first = fresh()
    from tests.integration.k8s.conftest import SESSION_ID, SESSION_LABEL

    bystander = f"atoll-bystander-{uuid.uuid4().hex[:12]}"  # a pod of someone else

    def never_started() -> Handle:
        cluster.api.create_namespaced_pod(cluster.namespace, {
            "metadata": {"name": bystander, "labels": {SESSION_LABEL: SESSION_ID}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "sleep", "image": cluster.busybox, "imagePullPolicy": "Never",
                "command": ["sleep", "600"]}]}})
        stack.append(lambda: cluster.api.delete_namespaced_pod(bystander, cluster.namespace,
                                                               grace_period_seconds=0))
        return Handle("k8s", f"atoll-never-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex,
                      extra={"namespace": cluster.namespace,
                             "secret": f"atoll-never-{uuid.uuid4().hex[:12]}"})

    def bystander_stays() -> bool:
        pod = cluster.api.read_namespaced_pod(bystander, cluster.namespace)  # 404: it was deleted
        return pod.metadata.deletion_timestamp is None and pod.status.phase in ("Pending",
                                                                                "Running")

    def request(workdir: Path, program: str, resources: Resources) -> LaunchRequest:
        made = make_request(first, program, workdir, resources=resources, token=_token())
        # The pod asks what the resources say (the k8s tests' usual 100m CPU is not the
        # contract's business).
        return dataclasses.replace(made, launcher_spec={})

    def absent(call: Callable[..., Any], name: str) -> bool:
        try:
            call(name, cluster.namespace)
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        return False

    def gone(handle: Handle, workdir: Path) -> bool:
        running = {"label": f"io.kubernetes.pod.name={handle.native_id}", "status": "running"}
        return (absent(cluster.api.read_namespaced_pod, handle.native_id)
                and absent(cluster.api.read_namespaced_secret, handle.extra["secret"])
                and not node.containers.list(filters=running))

    def resources_in(rendered: dict[str, Any]) -> tuple[int, int | None, int]:
        main = next(c for c in rendered["pod"]["spec"]["containers"]
                    if c["name"] == "atoll-worker")
        requests, limits = main["resources"]["requests"], main["resources"]["limits"]
        assert requests == limits, main["resources"]  # the worker gets what it asked, no more
        memory = requests.get("memory")
        return (int(requests["cpu"]), memory_to_bytes(memory) if memory else None,
                int(requests.get("nvidia.com/gpu", 0)))

    return Backend(
        name="k8s",
        launcher=first,
        fresh=fresh,
        request=request,
        running=lambda handle, workdir, notes: any(n.startswith("running") for n in notes),
        gone=gone,
        log=lambda handle, workdir: (workdir / "logs" / "worker.log").read_text(),
        resources_in=resources_in,
        never_started=never_started,
        untouched=bystander_stays,
    )


# -- Slurm ------------------------------------------------------------------------------------

_SLURM_LIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED",
               "RESIZING", "SIGNALING", "STAGE_OUT"}


def _slurm(launchers: list[Launcher], stack: list[Callable[[], None]]) -> Backend:
    from atoll.launchers.slurm import SlurmLauncher
    from tests.integration.slurm.conftest import SESSION_STUDY, make_request, slurm_site

    site = slurm_site()
    fresh = _closing(launchers, lambda: SlurmLauncher(site))
    bystander: list[str] = []  # a batch job of someone else, submitted with never_started's

    def never_started() -> Handle:
        bystander.append(subprocess.run(
            ["sbatch", "--parsable", "-J", "atoll-bystander", "-c", "1", "--mem=16M",
             "-o", "/dev/null", f"--comment=study={SESSION_STUDY}", "--wrap", "sleep 600"],
            capture_output=True, text=True, check=True).stdout.strip().split(";")[0])
        stack.append(lambda: subprocess.run(["scancel", *bystander], capture_output=True,
                                            check=True))
        return Handle("slurm", "60000001", uuid.uuid4().hex)  # no such job id

    def bystander_stays() -> bool:
        state = subprocess.run(["squeue", "-h", "--states=all", "-j", bystander[0], "-o", "%T"],
                               capture_output=True, text=True).stdout.strip()
        return state in ("PENDING", "CONFIGURING", "RUNNING")

    def request(workdir: Path, program: str, resources: Resources) -> LaunchRequest:
        return make_request(workdir, program, site_config=site, resources=resources)

    def gone(handle: Handle, workdir: Path) -> bool:
        state = subprocess.run(["squeue", "-h", "--states=all", "-j", handle.native_id,
                                "-o", "%T"], capture_output=True, text=True).stdout.strip()
        # The compute nodes are this machine: the worker's own processes must be gone too.
        return state not in _SLURM_LIVE and not _pids_of(workdir)

    def flag(argv: list[str], name: str) -> str | None:
        return next((a.partition("=")[2] for a in argv if a.startswith(f"--{name}=")), None)

    def resources_in(rendered: dict[str, Any]) -> tuple[int, int | None, int]:
        argv = rendered["sbatch_argv"]
        mem, gres = flag(argv, "mem"), flag(argv, "gres")
        return (int(flag(argv, "cpus-per-task")),
                memory_to_bytes(mem.removesuffix("M") + "Mi") if mem else None,
                int(gres.removeprefix("gpu:")) if gres else 0)

    return Backend(
        name="slurm",
        launcher=fresh(),
        fresh=fresh,
        request=request,
        running=lambda handle, workdir, notes: any(n.startswith("running on ") for n in notes),
        gone=gone,
        log=lambda handle, workdir: (workdir / "logs" / f"slurm-{handle.native_id}.out")
        .read_text(),
        resources_in=resources_in,
        never_started=never_started,
        untouched=bystander_stays,
    )


@pytest.fixture(params=[
    "process",
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("k8s", marks=pytest.mark.k8s),
    pytest.param("slurm", marks=pytest.mark.slurm),
])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    launchers: list[Launcher] = []
    stack: list[Callable[[], None]] = []
    try:
        if request.param == "process":
            if not hasattr(os, "sched_getaffinity"):
                pytest.skip("the process launcher needs Linux")
            yield _process(launchers, stack)
        elif request.param == "docker":
            yield _docker(request.getfixturevalue("docker_engine"), launchers, stack)
        elif request.param == "k8s":
            yield _k8s(request.getfixturevalue("cluster"), launchers, stack)
        else:
            request.getfixturevalue("slurm_cluster")
            yield _slurm(launchers, stack)
    finally:
        for launcher in launchers:
            launcher.close()
        for undo in reversed(stack):
            undo()


# -- the contract -----------------------------------------------------------------------------


def test_render_is_deterministic_and_holds_no_credential(backend: Backend, tmp_path: Path):
    request = backend.request(tmp_path / "run", EXIT_0, LAUNCHED)
    first = backend.launcher.render(request)
    assert backend.launcher.render(request) == first
    assert backend.fresh().render(dataclasses.replace(request)) == first
    text = json.dumps(first, sort_keys=True, default=str)
    for name, value in request.credentials.items():
        assert value not in text, f"the value of {name} is in the render"
    assert not (tmp_path / "run").exists()  # rendering creates nothing


@pytest.mark.parametrize(("program", "outcome", "code", "output"), [
    (EXIT_0, Outcome.COMPLETED, 0, "worker done"),
    (EXIT_3, Outcome.FAILED, 3, "bad input"),
], ids=["exit-0", "exit-3"])
def test_launch_then_wait_gives_the_outcome_and_the_code(
    backend: Backend, tmp_path: Path, program: str, outcome: Outcome, code: int, output: str
):
    workdir = tmp_path / "run"
    request = backend.request(workdir, program, LAUNCHED)
    rendered = render_digest(backend.launcher.render(request))
    handle = backend.launcher.launch(request)
    assert handle.backend == backend.name and handle.native_id
    assert handle.extra[RENDER_DIGEST] == rendered  # the site's launch entry names what ran
    result = backend.launcher.wait(handle)
    assert (result.outcome, result.exit_code) == (outcome, code), result.reason
    if code:
        assert "exited with code 3" in result.reason
    assert output in backend.log(handle, workdir)
    eventually(lambda: backend.gone(handle, workdir), "the ended worker is cleaned up")


def test_cancel_is_prompt_and_idempotent(backend: Backend, tmp_path: Path):
    workdir = tmp_path / "run"
    notes: list[str] = []
    handle = backend.launcher.launch(backend.request(workdir, SLEEP, LAUNCHED),
                                     on_progress=notes.append)
    waited: list[Any] = []
    waiter = threading.Thread(target=lambda: waited.append(backend.launcher.wait(handle)))
    waiter.start()  # as a site parent's supervisor does: wait() blocks in a thread of its own
    eventually(lambda: backend.running(handle, workdir, notes), "the worker runs")
    assert not backend.gone(handle, workdir)
    start = time.monotonic()
    backend.launcher.cancel(handle)
    returned = time.monotonic() - start
    took = eventually(lambda: backend.gone(handle, workdir), "the cancelled worker is gone")
    print(f"\n[{backend.name}] cancel() returned after {returned:.2f} s; "
          f"the worker was gone {took + returned:.2f} s after cancel()")  # reported, not asserted
    waiter.join(GUARD_S)
    assert waited and waited[0].outcome is Outcome.ABORTED, waited
    backend.launcher.cancel(handle)  # again: a worker already gone counts as cancelled
    assert backend.launcher.wait(handle).outcome is Outcome.ABORTED
    assert backend.gone(handle, workdir)


def test_cancel_after_the_end_changes_nothing(backend: Backend, tmp_path: Path):
    workdir = tmp_path / "run"
    handle = backend.launcher.launch(backend.request(workdir, EXIT_0, LAUNCHED))
    assert backend.launcher.wait(handle).outcome is Outcome.COMPLETED
    backend.launcher.cancel(handle)
    backend.launcher.cancel(handle)
    backend.fresh().cancel(handle)  # a restarted parent cancelling a worker long gone
    eventually(lambda: backend.gone(handle, workdir), "the ended worker is cleaned up")
    assert "worker done" in backend.log(handle, workdir)


def test_cancel_of_a_handle_never_started_is_a_no_op(backend: Backend):
    handle = backend.never_started()
    backend.launcher.cancel(handle)
    backend.fresh().cancel(handle)
    assert backend.untouched()


@pytest.mark.parametrize("resources", [
    Resources(num_of_cpus=1, memory="64Mi", num_of_gpus=0),
    Resources(num_of_cpus=2, memory="256Mi", num_of_gpus=1),
], ids=["1cpu-64Mi", "2cpu-256Mi-1gpu"])
def test_resources_show_in_the_native_render(backend: Backend, tmp_path: Path,
                                             resources: Resources):
    rendered = backend.launcher.render(backend.request(tmp_path / "run", EXIT_0, resources))
    assert backend.resources_in(rendered) == (
        resources.num_of_cpus, resources.memory_bytes, resources.num_of_gpus)
