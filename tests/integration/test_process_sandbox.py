"""The process launcher's sandbox (bwrap) with real workers: what a job's code can reach.

Each test runs a tiny worker program under the real launcher and checks what it saw; the same
program without the sandbox (`sandbox: none`) reaches what the sandboxed one cannot, so every
check here fails when the confinement is switched off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
import yaml

from atoll.launchers.base import JobIdentity, LaunchError, Outcome
from atoll.launchers.process import ProcessLauncher
from atoll.launchers.request import build_request
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")

PROBE = """
import json, os
def attempt(path, write=False):
    try:
        if write:
            with open(path, "w") as f:
                f.write("x")
            return "wrote"
        with open(path, "rb") as f:
            return "read:" + f.read(64).decode("utf-8", "replace")
    except OSError as exc:
        return type(exc).__name__
targets = json.loads(os.environ["PROBE_TARGETS"])
seen = {name: attempt(path, write) for name, (path, write) in targets.items()}
seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
seen["marker_seen"] = []  # which processes' environments hold the parent's secret
for pid in seen["pids"]:
    try:
        if b"PARENT_SECRET=" in open(f"/proc/{pid}/environ", "rb").read():
            seen["marker_seen"].append(pid)
    except OSError:
        pass
seen["datasets"] = json.loads(os.environ.get("ATOLL_DATASETS", "{}"))
seen["home"] = os.environ.get("HOME")
print(json.dumps(seen))
"""


@pytest.fixture
def host(tmp_path):
    """A parent's neighbourhood: its key, another job's folder, two studies' datasets."""
    kit = tmp_path / "kit"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "client.key").write_text("PARENT-KEY")
    other_job = kit / "workspace" / "jobs" / "other"
    other_job.mkdir(parents=True)
    (other_job / "result.txt").write_text("OTHER-JOB")
    for study in ("alpha", "beta"):
        (tmp_path / "data" / study).mkdir(parents=True)
        (tmp_path / "data" / study / "marker.txt").write_text(f"{study.upper()}-DATA")
    (tmp_path / "data" / "scratch").mkdir()
    return tmp_path


def runtime_for(tmp_path: Path):
    text = textwrap.dedent(f"""\
        format_version: 2
        studies:
          alpha:
            datasets:
              images: {{source: {tmp_path}/data/alpha, mode: ro}}
              scratch: {{source: {tmp_path}/data/scratch, mode: rw}}
        """)
    return parse_study_runtime(yaml.safe_load(text), "process")


@pytest.fixture(scope="module")
def parent_socket():
    """A unix socket standing in for the parent's worker endpoint (the probes never dial it),
    in a short folder: a socket's path has at most 107 bytes."""
    import socket

    folder = tempfile.mkdtemp(prefix="atoll-w-")
    path = os.path.join(folder, "worker.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        yield path
    shutil.rmtree(folder, ignore_errors=True)


def run_probe(tmp_path: Path, sandbox: str, targets: dict[str, tuple[str, bool]],
              parent_socket: str) -> dict:
    config = parse_site_config({"launcher": "process", "process": {"sandbox": sandbox}})
    launcher = ProcessLauncher(config, share_cpus=False)
    meta = load_meta({"name": "t", "deploy_map": {"app": ["@ALL"]}})
    workdir = tmp_path / "kit" / "workspace" / "jobs" / f"job-{sandbox}"
    (workdir / "app").mkdir(parents=True)
    (workdir / "app" / "train.py").write_text("print('app')\n")
    request = build_request(
        meta=meta, identity=JobIdentity("a" * 32, "t", "alpha", "site-a", "site"),
        site_config=config, study_runtime=runtime_for(tmp_path), workdir=workdir,
        parent_address="127.0.0.1:1", credentials={"ATOLL_JOB_TOKEN": "tok"},
        worker_args=("-c", PROBE), parent_socket=parent_socket)
    request.worker_env["PROBE_TARGETS"] = json.dumps(targets)  # type: ignore[index]
    result = launcher.wait(launcher.launch(request))
    log = (workdir / "logs" / "worker.log").read_text()
    assert result.outcome is Outcome.COMPLETED, log
    return json.loads(log.splitlines()[-1])


def targets_of(tmp_path: Path, sandbox: str) -> dict[str, tuple[str, bool]]:
    workdir = tmp_path / "kit" / "workspace" / "jobs" / f"job-{sandbox}"
    data = "/data/alpha" if sandbox == "bwrap" else str(tmp_path / "data")
    return {
        "parent_key": (str(tmp_path / "kit" / "startup" / "client.key"), False),
        "other_job": (str(tmp_path / "kit" / "workspace" / "jobs" / "other" / "result.txt"), False),
        "beta_data": (str(tmp_path / "data" / "beta" / "marker.txt"), False),
        "own_data": (f"{data}/images/marker.txt" if sandbox == "bwrap"
                     else str(tmp_path / "data" / "alpha" / "marker.txt"), False),
        "own_data_write": (f"{data}/images/new.txt" if sandbox == "bwrap"
                           else str(tmp_path / "data" / "alpha" / "new.txt"), True),
        "scratch_write": (f"{data}/scratch/out.txt" if sandbox == "bwrap"
                          else str(tmp_path / "data" / "scratch" / "out.txt"), True),
        "run_folder_write": (str(workdir / "out.txt"), True),
        "app_write": (str(workdir / "app" / "planted.py"), True),
        "host_shadow": ("/etc/shadow", False),
    }


@pytest.fixture(autouse=True)
def secret_holder():
    """A process of the parent's user whose environment block holds a secret, as a site
    parent started with another study's secret exported does."""
    holder = subprocess.Popen(["sleep", "120"],
                              env={"PARENT_SECRET": "held-for-another-study", "PATH": "/usr/bin"})
    yield holder.pid
    holder.kill()
    holder.wait()


def test_a_sandboxed_worker_sees_its_job_and_nothing_else(host, parent_socket):
    seen = run_probe(host, "bwrap", targets_of(host, "bwrap"), parent_socket)
    for name in ("parent_key", "other_job", "beta_data"):
        assert seen[name] == "FileNotFoundError", (name, seen[name])
    assert seen["host_shadow"] == "FileNotFoundError"
    assert seen["own_data"] == "read:ALPHA-DATA"
    assert seen["own_data_write"] in ("OSError", "PermissionError")  # a read-only mount
    assert seen["scratch_write"] == "wrote" and (host / "data" / "scratch" / "out.txt").exists()
    assert seen["run_folder_write"] == "wrote"
    assert seen["app_write"] in ("OSError", "PermissionError")
    assert seen["datasets"] == {"images": "/data/alpha/images", "scratch": "/data/alpha/scratch"}
    # Its own PID namespace: bwrap's init and the worker, never the parent or anyone else.
    assert max(seen["pids"]) < 10 and os.getpid() not in seen["pids"]
    assert seen["marker_seen"] == []
    assert seen["home"] == "/tmp"


def test_without_the_sandbox_the_same_worker_reaches_the_parent(host, secret_holder,
                                                               parent_socket):
    """The check above is not vacuous: unconfined, each of those reads succeeds."""
    seen = run_probe(host, "none", targets_of(host, "none"), parent_socket)
    assert seen["parent_key"] == "read:PARENT-KEY"
    assert seen["other_job"] == "read:OTHER-JOB"
    assert seen["beta_data"] == "read:BETA-DATA"
    assert os.getpid() in seen["pids"] and secret_holder in seen["marker_seen"]


def _trivial_request(config, runtime, workdir: Path):
    """A study alpha job whose worker does nothing: for launches refused before it runs."""
    return build_request(
        meta=load_meta({"name": "t", "deploy_map": {"app": ["@ALL"]}}),
        identity=JobIdentity("b" * 32, "t", "alpha", "site-a", "site"), site_config=config,
        study_runtime=runtime, workdir=workdir, parent_address="127.0.0.1:1",
        worker_args=("-c", "pass"))


def test_a_missing_dataset_folder_is_a_launch_error_naming_it(host):
    config = parse_site_config({"launcher": "process", "process": {"sandbox": "bwrap"}})
    launcher = ProcessLauncher(config, share_cpus=False)
    runtime = parse_study_runtime(yaml.safe_load(textwrap.dedent(f"""\
        format_version: 2
        studies:
          alpha:
            datasets:
              images: {{source: {host}/data/missing, mode: ro}}
        """)), "process")
    request = _trivial_request(config, runtime, host / "job")
    with pytest.raises(LaunchError, match=r"dataset images of study alpha: .*/data/missing is not "
                                          r"a folder on this host \(local/study_runtime.yaml\)"):
        launcher.launch(request)


def test_a_host_without_a_working_bwrap_says_how_to_opt_out(tmp_path):
    config = parse_site_config({"launcher": "process",
                                "process": {"sandbox": "bwrap", "bwrap": "/bin/false"}})
    launcher = ProcessLauncher(config, share_cpus=False)
    request = _trivial_request(config, None, tmp_path / "job")
    with pytest.raises(LaunchError, match=r"could not make a sandbox here.*`process: "
                                          r"\{sandbox: none\}`"):
        launcher.launch(request)


def test_a_python_under_tmp_is_seen_through_the_private_tmp(tmp_path):
    """A runtime folder under /tmp (a virtual environment in a temporary clone, as CI has it)
    is mounted over the sandbox's private /tmp, not hidden by it."""
    import sys

    from atoll.launchers.process_sandbox import bwrap_binary, probe_host

    venv = Path(tempfile.mkdtemp(dir="/tmp", prefix="atoll-venv-"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        host = probe_host(python, bwrap_binary(None))  # starts one sandbox with that Python
        assert str(venv) in host.runtime
    finally:
        shutil.rmtree(venv, ignore_errors=True)


NETWORK_PROBE = """
import json, os, socket
from atoll.launchers.process_network import FORWARD_ENV, forward_inside
if os.environ.get(FORWARD_ENV):  # what atoll's worker does before the job's code runs
    forward_inside(os.environ[FORWARD_ENV])
targets = json.loads(os.environ["PROBE_TARGETS"])
def talk(host, port):
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"hello")
            return s.recv(100).decode()
    except OSError as exc:
        return type(exc).__name__
seen = {name: talk(host, port) for name, (host, port) in targets.items()}
seen["resolved"] = socket.gethostbyname(targets["by_name"][0])
print(json.dumps(seen))
"""


@pytest.fixture
def echo_servers():
    """Three host services that answer 'echo: <what they got>' on 127.0.0.1."""
    import socket
    import threading

    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]

    def serve(server):
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"echo: " + conn.recv(100))

    for server in servers:
        threading.Thread(target=serve, args=(server,), daemon=True).start()
    yield [s.getsockname()[1] for s in servers]
    for server in servers:
        server.close()


@pytest.mark.parametrize("network", ["isolated", "host"])
def test_a_worker_reaches_the_allowed_destinations_and_nothing_else(tmp_path, parent_socket,
                                                                    echo_servers, network):
    """Allowed: a loopback address and this host's own name (relayed; the name resolves to a
    loopback address of the sandbox's own). Not allowed: the third service. On the host's
    network (the opt-out) the third one answers too: the check is not vacuous."""
    import socket

    name = socket.gethostname()
    if not name or "_" in name or socket.gethostbyname(name) != "127.0.0.1":
        pytest.skip(f"this host's name {name!r} does not resolve to 127.0.0.1")
    by_ip, by_name, other = echo_servers
    block = {"network": "host"} if network == "host" else {
        "network": {"allow": [f"127.0.0.1:{by_ip}", f"{name}:{by_name}"]}}
    config = parse_site_config({"launcher": "process", "process": block})
    launcher = ProcessLauncher(config, share_cpus=False)
    workdir = tmp_path / "job"
    (workdir / "app").mkdir(parents=True)
    request = build_request(
        meta=load_meta({"name": "t", "deploy_map": {"app": ["@ALL"]}}),
        identity=JobIdentity("c" * 32, "t", "alpha", "site-a", "site"), site_config=config,
        study_runtime=None, workdir=workdir, parent_address="127.0.0.1:1",
        credentials={"ATOLL_JOB_TOKEN": "tok"}, worker_args=("-c", NETWORK_PROBE),
        parent_socket=parent_socket)
    request.worker_env["PROBE_TARGETS"] = json.dumps(  # type: ignore[index]
        {"by_ip": ["127.0.0.1", by_ip], "by_name": [name, by_name], "other": ["127.0.0.1", other]})
    try:
        result = launcher.wait(launcher.launch(request))
    finally:
        launcher.close()
    log = (workdir / "logs" / "worker.log").read_text()
    assert result.outcome is Outcome.COMPLETED, log
    seen = json.loads(log.splitlines()[-1])
    assert seen["by_ip"] == seen["by_name"] == "echo: hello"
    if network == "isolated":
        assert seen["resolved"] == "127.0.100.1"
        assert seen["other"] == "ConnectionRefusedError"
    else:
        assert seen["other"] == "echo: hello"
