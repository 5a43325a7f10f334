"""The process launcher with real child processes: limits, GPUs, logs, cancel.

What every launcher does (exit codes, cancel, unknown handles, resources in the render) is
tests/integration/launchers/test_contract.py; here is this launcher's own behaviour.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from atoll.launchers.base import JobIdentity, LaunchError, Outcome
from atoll.launchers.process import ProcessLauncher
from atoll.launchers.process_memory_limit import create_memory_cgroup
from atoll.launchers.request import build_request
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


def make_launcher(gpu_ids=(), share_cpus=False, sandbox="bwrap", **kw):
    """A launcher that counts only its own workers' CPUs, unless share_cpus: tests that check
    which CPU a worker got must not see other atoll parents running on this machine."""
    config = parse_site_config({"launcher": "process",
                                "process": {"gpu_ids": list(gpu_ids), "sandbox": sandbox}})
    return ProcessLauncher(config, share_cpus=share_cpus, **kw), config


def host_pids(workdir: Path) -> list[int]:
    """A worker's processes as the host numbers them (a sandbox has its own PID namespace):
    those whose environment names its run folder."""
    marker = f"ATOLL_WORKDIR={workdir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


_SOCKETS: list[socket.socket] = []  # kept open for the module: a parent's socket stands bound


def parent_socket(tmp_path: Path) -> Path:
    """A bound unix socket standing in for the site parent's: workers in their own network
    namespace get it bound into their sandbox (these workers never dial it)."""
    path = tmp_path / "parent.sock"
    if not path.exists():
        tmp_path.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        _SOCKETS.append(sock)
    return path


def request(config, tmp_path, code, job="a", gpus=0, cpus=1, memory=None, token="tok-123"):
    res = {"num_of_gpus": gpus, "num_of_cpus": cpus, **({"memory": memory} if memory else {})}
    meta = load_meta(
        {"name": "t", "deploy_map": {"app": ["@ALL"]}, "resource_spec": {"@default": res}}
    )
    job_id = job.ljust(32, "0")
    ident = JobIdentity(job_id, "t", "study", "site-a", "site")
    return build_request(
        meta=meta,
        identity=ident,
        site_config=config,
        study_runtime=None,
        workdir=tmp_path / job,
        parent_address="127.0.0.1:1",
        parent_socket=str(parent_socket(tmp_path)),
        credentials={"ATOLL_JOB_TOKEN": token},
        worker_args=("-c", textwrap.dedent(code)),
    )


def wait_for(path: Path, deadline_s: float = 20.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie counts as gone
        return f.read().split(") ")[1][0] != "Z"


REPORT = """
import json, os, sys
creds = json.loads(os.read(int(os.environ["ATOLL_CREDENTIALS_FD"]), 65536))
print(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "cuda": os.environ["CUDA_VISIBLE_DEVICES"],
                  "token": creds.get("ATOLL_JOB_TOKEN"), "env_token": os.environ.get("ATOLL_JOB_TOKEN"),
                  "secret": os.environ.get("PARENT_SECRET"),
                  "pgid": os.getpgid(0), "pid": os.getpid(), "sid": os.getsid(0),
                  "workdir": os.environ["ATOLL_WORKDIR"], "cwd": os.getcwd()}))
"""


def report_of(tmp_path, job):
    return json.loads((tmp_path / job / "logs" / "worker.log").read_text().splitlines()[-1])


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_environment_affinity_session_and_log(tmp_path, monkeypatch, sandbox):
    monkeypatch.setenv("PARENT_SECRET", "other-studies-secret")
    launcher, config = make_launcher(cpus=sorted(os.sched_getaffinity(0)), sandbox=sandbox)
    handle = launcher.launch(request(config, tmp_path, REPORT))
    result = launcher.wait(handle)
    assert (result.outcome, result.reason, result.exit_code) == (
        Outcome.COMPLETED,
        "worker exited with code 0",
        0,
    )
    seen = report_of(tmp_path, "a")
    assert seen["token"] == "tok-123"  # through the credentials pipe only
    assert seen["env_token"] is None  # never in an environment block /proc shows
    assert seen["secret"] is None  # the parent's other variables are not inherited
    if sandbox == "none":
        assert seen["pgid"] == seen["pid"] == seen["sid"]  # own session and process group
    assert handle.extra["sandbox"] == sandbox
    assert seen["cpus"] == [min(os.sched_getaffinity(0))]
    assert seen["cwd"] == seen["workdir"] == str(tmp_path / "a")
    assert seen["cuda"] == ""


def test_two_jobs_get_different_cpus_and_gpus_and_a_third_gpu_job_is_refused(tmp_path):
    host = sorted(os.sched_getaffinity(0))
    launcher, config = make_launcher(gpu_ids=["fake-0", "fake-1"], cpus=host)
    hold = REPORT + "\nimport time\nsys.stdout.flush()\ntime.sleep(60)\n"
    first = launcher.launch(request(config, tmp_path, hold, job="a", gpus=1))
    second = launcher.launch(request(config, tmp_path, hold, job="b", gpus=1))
    with pytest.raises(
        LaunchError, match=r"only 0 of this site's 2 are free; in use: fake-0 \(job a"
    ):
        launcher.launch(request(config, tmp_path, REPORT, job="c", gpus=1))
    reports = [json.loads(wait_for(tmp_path / j / "logs" / "worker.log")) for j in ("a", "b")]
    assert sorted(r["cuda"] for r in reports) == ["fake-0", "fake-1"]
    if len(host) >= 2:
        assert reports[0]["cpus"] != reports[1]["cpus"]
    launcher.cancel(first)
    assert launcher.wait(first).outcome is Outcome.ABORTED
    third = launcher.launch(
        request(config, tmp_path, REPORT, job="c", gpus=1)
    )  # fake-0 is free again
    assert launcher.wait(third).outcome is Outcome.COMPLETED
    assert report_of(tmp_path, "c")["cuda"] == "fake-0"
    launcher.cancel(second)


def test_two_sites_on_one_host_pin_their_workers_to_different_cpus(tmp_path, monkeypatch):
    """The parents of a local federation each have a launcher; the CPUs one pinned count for
    the other (HostCpuLeases in the temporary folder), so both workers do not share CPU 0."""
    host = sorted(os.sched_getaffinity(0))
    if len(host) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    hold = REPORT + "\nimport time\nsys.stdout.flush()\ntime.sleep(60)\n"
    site_a, config = make_launcher(cpus=host, share_cpus=True)
    site_b, _ = make_launcher(cpus=host, share_cpus=True)
    first = site_a.launch(request(config, tmp_path, hold, job="a"))
    second = site_b.launch(request(config, tmp_path, hold, job="b"))
    reports = [json.loads(wait_for(tmp_path / j / "logs" / "worker.log")) for j in ("a", "b")]
    assert reports[0]["cpus"] == [host[0]]
    assert reports[1]["cpus"] == [host[1]]
    site_a.cancel(first)
    assert site_a.wait(first).outcome is Outcome.ABORTED
    third = site_b.launch(request(config, tmp_path, REPORT, job="c"))  # host[0] is free again
    assert site_b.wait(third).outcome is Outcome.COMPLETED
    assert report_of(tmp_path, "c")["cpus"] == [host[0]]
    site_b.cancel(second)
    site_b.wait(second)
    assert not list((tmp_path / "tmp").glob("*/*.lease"))  # nothing left pinned


def test_exit_codes_and_signals_are_named(tmp_path):
    launcher, config = make_launcher()
    failed = launcher.wait(launcher.launch(request(config, tmp_path, "import sys; sys.exit(3)")))
    assert failed.outcome is Outcome.FAILED and failed.exit_code == 3
    assert failed.reason.startswith("worker exited with code 3; see ")
    killed = launcher.wait(
        launcher.launch(
            request(
                config, tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", job="b"
            )
        )
    )
    assert killed.outcome is Outcome.FAILED
    assert killed.reason.startswith("killed by signal 9 (SIGKILL)")


HOG = "b = []\nwhile True:\n    b.append(bytearray(16 * 1024 * 1024))\n"


def test_memory_limit_in_a_cgroup_kills_a_hog(tmp_path):
    probe = create_memory_cgroup("atoll-probe-test", 64 * 1024 * 1024)
    if probe is None:
        pytest.skip("no writable memory cgroup here: the launcher falls back to RLIMIT_AS")
    probe.remove()
    launcher, config = make_launcher(memory_mode="cgroup")
    handle = launcher.launch(request(config, tmp_path, HOG, memory="128Mi"))
    assert handle.extra["memory_limit"] in ("cgroup-v1", "cgroup-v2")
    result = launcher.wait(handle)
    assert result.outcome is Outcome.FAILED
    assert result.reason == "out of memory (limit 128Mi): killed by signal 9 (SIGKILL)"
    cgroup_dir = Path(handle.extra.get("cgroup", "")) if "cgroup" in handle.extra else None
    assert cgroup_dir is None or not cgroup_dir.exists()


def test_memory_limit_as_rlimit_fails_a_hog_with_a_reason(tmp_path):
    launcher, config = make_launcher(memory_mode="rlimit")
    handle = launcher.launch(request(config, tmp_path, HOG, memory="256Mi"))
    assert handle.extra["memory_limit"] == "rlimit-as"
    result = launcher.wait(handle)
    assert result.outcome is Outcome.FAILED
    assert result.reason == (
        "out of memory (address-space limit 256Mi): worker exited with code 1 after a MemoryError"
    )


GROUP = """
import os, subprocess, sys, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN) if len(sys.argv) > 1 else None
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(2)]
with open(os.path.join(os.environ["ATOLL_WORKDIR"], "pids"), "w") as f:
    f.write(" ".join(str(k.pid) for k in kids) + "\\n")
time.sleep(300)
"""


@pytest.mark.parametrize("ignores_sigterm", [False, True])
@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_cancel_kills_the_whole_group_and_is_idempotent(tmp_path, ignores_sigterm, sandbox):
    launcher, config = make_launcher(grace_s=0.5, sandbox=sandbox)
    code = GROUP.replace("len(sys.argv) > 1", "True" if ignores_sigterm else "False")
    handle = launcher.launch(request(config, tmp_path, code))
    wait_for(tmp_path / "a" / "pids")
    kids = host_pids(tmp_path / "a")
    assert len(kids) >= 3 and all(alive(k) for k in kids)  # the worker and its two children
    launcher.cancel(handle)
    assert not alive(int(handle.native_id))
    assert not any(alive(k) for k in kids)
    launcher.cancel(handle)  # again: a worker already gone counts as cancelled
    result = launcher.wait(handle)
    assert (result.outcome, result.reason) == (Outcome.ABORTED, "cancelled")
    launcher.cancel(handle)


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_finished_worker_leaves_no_process_behind(tmp_path, sandbox):
    launcher, config = make_launcher(sandbox=sandbox)
    code = GROUP.replace('time.sleep(300)\n"""', "") + "\n"
    code = code.rsplit("time.sleep(300)", 1)[0]  # the leader exits, its children would linger
    handle = launcher.launch(request(config, tmp_path, code))
    result = launcher.wait(handle)
    assert (tmp_path / "a" / "pids").read_text().split()  # the children were started
    assert result.outcome is Outcome.COMPLETED
    assert host_pids(tmp_path / "a") == []
    launcher.cancel(handle)  # after the end: nothing to do, no error


def test_close_cancels_every_running_worker(tmp_path):
    launcher, config = make_launcher(grace_s=0.5)
    handles = [
        launcher.launch(request(config, tmp_path, "import time; time.sleep(300)", job=j))
        for j in ("a", "b")
    ]
    launcher.close()
    assert not any(alive(int(h.native_id)) for h in handles)
    assert all(launcher.wait(h).outcome is Outcome.ABORTED for h in handles)


def test_a_missing_python_is_a_launch_error_and_frees_the_gpus(tmp_path):
    config = parse_site_config(
        {"launcher": "process", "process": {"python": "/nonexistent/python", "gpu_ids": ["g0"]}}
    )
    launcher = ProcessLauncher(config)
    with pytest.raises(LaunchError, match="'/nonexistent/python'"):
        launcher.launch(request(config, tmp_path, "pass", gpus=1))
    config_ok = parse_site_config({"launcher": "process", "process": {"python": sys.executable}})
    assert ProcessLauncher(config_ok) is not None
    assert launcher._gpus.in_use() == {}


def test_wait_for_an_unknown_handle_says_so(tmp_path):
    launcher, _ = make_launcher()
    from atoll.launchers.base import Handle

    result = launcher.wait(Handle("process", "999999", "x", extra={"key": "nope"}))
    assert result.outcome is Outcome.FAILED and "no worker 999999 was started here" in result.reason
