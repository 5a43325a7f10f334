"""Hostile job containers and pods on the real engines (issue #19): nothing of the site parent.

A real site kit is written to disk (startup/client.key, local/site.yaml, local/study_runtime.yaml
mapping two studies, each with its own dataset), read back by the spec loaders as the site
parent reads it, and the job's worker is started through the atoll launcher with that study
runtime. The worker is hostile: it scans /proc for any process whose environment holds a marker
this test put in its own environment (the test process is the site parent here: it runs the
launcher), reads /proc/1/environ, and tries the site kit's private key, the site's
study_runtime.yaml, the other study's dataset (its host path and its /data path), the engines'
sockets and the host's /proc. Every attempt must fail (the file is not in the container, or
cannot be read), its own dataset must be readable, and the kernel must report it unprivileged.

Docker: scripts/backends/docker.sh up; Kubernetes: scripts/backends/k8s.sh up. Without them the
tests skip, or fail under CI=true (the fixtures of tests/integration, see conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.launchers.base import JobIdentity, LaunchRequest, Outcome
from atoll.launchers.docker import DockerLauncher
from atoll.launchers.kubernetes import KubernetesLauncher
from atoll.launchers.request import job_run_folder
from atoll.spec.resources import Resources
from atoll.spec.site_config import load_site_config
from atoll.spec.study_runtime import load_study_runtime
from tests.integration.docker.conftest import SESSION_ID as DOCKER_SESSION
from tests.integration.docker.conftest import SESSION_LABEL as DOCKER_LABEL
from tests.integration.docker.conftest import Engine, make_request
from tests.integration.k8s.conftest import SESSION_ID as K8S_SESSION
from tests.integration.k8s.conftest import SESSION_LABEL as K8S_LABEL
from tests.integration.k8s.conftest import Cluster, pod_template

MARKER_VAR = "ATOLL_TEST_PARENT_MARKER"
KEY_TEXT = "-----BEGIN PRIVATE KEY----- site kit key of the confinement test"


def write_kit(root: Path, site: dict[str, Any], studies: dict[str, Any]) -> Path:
    """A site kit as provisioning and the operator leave it; returns the kit folder."""
    kit = root / "site-1"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "client.key").write_text(KEY_TEXT)
    (kit / "startup" / "client.key").chmod(0o600)
    (kit / "local").mkdir()
    (kit / "local" / "site.yaml").write_text(yaml.safe_dump(site))
    runtime = {"format_version": 2, "studies": studies}
    (kit / "local" / "study_runtime.yaml").write_text(yaml.safe_dump(runtime))
    return kit


def dataset(root: Path, name: str, text: str) -> Path:
    folder = root / "data" / name
    folder.mkdir(parents=True)
    (folder / "file.txt").write_text(text)
    folder.chmod(0o755)
    (folder / "file.txt").chmod(0o644)
    return folder


def targets(kit: Path, other_data: Path, sockets: list[str]) -> dict[str, str]:
    """What the hostile worker tries to open, by what it would steal."""
    return {
        "site private key": str(kit / "startup" / "client.key"),
        "site study_runtime.yaml": str(kit / "local" / "study_runtime.yaml"),
        "site site.yaml": str(kit / "local" / "site.yaml"),
        "other study's dataset (host path)": str(other_data / "file.txt"),
        "parent's environment (host pid)": f"/proc/{os.getpid()}/environ",
        "parent's command line (host pid)": f"/proc/{os.getpid()}/cmdline",
        "key through /proc/1/root": f"/proc/1/root{kit}/startup/client.key",
        **{f"engine socket {s}": s for s in sockets},
    }


# --- the hostile worker, in Python (docker job image) --------------------------------------------
PY_PROBE = textwrap.dedent(
    """
    import glob, json, socket
    marker, targets, own, other = json.loads(ARGS)
    out = {"environ_hits": [], "pids": [], "opened": {}, "status": {}}
    for path in glob.glob("/proc/[0-9]*/environ"):
        out["pids"].append(path.split("/")[2])
        try:
            if marker.encode() in open(path, "rb").read():
                out["environ_hits"].append(path)
        except OSError:
            pass
    try:
        out["pid1_environ_has_marker"] = marker.encode() in open("/proc/1/environ", "rb").read()
    except OSError as err:
        out["pid1_environ_has_marker"] = type(err).__name__
    out["pid1_is_docker_init"] = b"docker-init" in open("/proc/1/cmdline", "rb").read()
    for what, path in list(targets.items()) + [("other study's dataset (/data path)", other)]:
        try:
            with open(path, "rb") as f:
                out["opened"][what] = "READ " + f.read(64).decode(errors="replace")
        except OSError as err:
            out["opened"][what] = type(err).__name__
        if "socket" in what:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                out["opened"][what] = "CONNECTED"
            except OSError:
                pass
            finally:
                s.close()
    out["own"] = open(own).read()
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"):
            out["status"][key] = value.strip()
    print("CONFINEMENT " + json.dumps(out), flush=True)
    """
)


def probe_report(log: str) -> dict[str, Any]:
    found = re.search(r"^CONFINEMENT (\{.*\})$", log, re.MULTILINE)
    assert found, f"the hostile worker reported nothing; its log:\n{log}"
    return json.loads(found.group(1))


def assert_confined(report: dict[str, Any], own_text: str) -> None:
    assert report["environ_hits"] == [], "a process with the parent's environment is visible"
    assert report["pid1_environ_has_marker"] is not True
    leaked = {k: v for k, v in report["opened"].items()
              if v not in ("FileNotFoundError", "PermissionError", "NotADirectoryError")}
    assert leaked == {}, f"the job reached the parent's files: {leaked}"
    assert report["own"] == own_text  # its own dataset is there
    assert len(report["pids"]) < 10, f"the host's processes are visible: {report['pids']}"
    status = report["status"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status


# --- docker --------------------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.parametrize("user", [None, "0:0"], ids=["default-user", "root-in-container"])
def test_hostile_docker_worker_reaches_nothing_of_the_parent(
    docker_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None
) -> None:
    marker = f"parent-marker-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARKER_VAR, marker)  # the site parent's own environment
    own, other = dataset(tmp_path, "scans", "own scans"), dataset(tmp_path, "records", "theirs")
    site = {
        "launcher": "docker",
        "docker": {
            "base_url": docker_engine.env["DOCKER_HOST"],
            "default_image": docker_engine.env["ATOLL_TEST_PYTHON_IMAGE"],  # only python3
            "pull_policy": "never",
            "labels": {"atoll.test": "1", DOCKER_LABEL: DOCKER_SESSION},
        },
    }
    imaging: dict[str, Any] = {"datasets": {"scans": {"source": str(own), "mode": "ro"}}}
    if user:
        imaging["docker_kwargs"] = {"user": user}
    studies = {"imaging": imaging, "other": {"datasets": {"records": {"source": str(other),
                                                                      "mode": "ro"}}}}
    kit = write_kit(tmp_path, site, studies)
    config = load_site_config(kit / "local" / "site.yaml")
    runtime = load_study_runtime(kit / "local", "docker")
    engine_socket = docker_engine.env["DOCKER_HOST"].removeprefix("unix://")
    sockets = [engine_socket, "/var/run/docker.sock", "/run/docker.sock"]
    args = [marker, targets(kit, other, sockets), "/data/imaging/scans/file.txt",
            "/data/other/records/file.txt"]
    program = f"ARGS = {json.dumps(json.dumps(args))}\n{PY_PROBE}"
    launcher = DockerLauncher(config)
    request = make_request(
        Path("/unused"), program, site_config=config, study=runtime.entry("imaging"),
        resources=Resources(num_of_gpus=0, num_of_cpus=1, memory="256Mi"),
    )
    workdir = job_run_folder(config, request.identity.job_id)  # <kit>/workspace/jobs/<id>
    workdir.mkdir(parents=True)
    request = replace(request, workdir=workdir)
    rendered = launcher.render(request)["containers.run"]
    assert [m["Source"] for m in rendered["mounts"]] == [str(workdir), str(own)]
    try:
        result = launcher.wait(launcher.launch(request))
    finally:
        launcher.close()
    log = (workdir / "logs" / "worker.log").read_text()
    assert result.outcome is Outcome.COMPLETED, f"{result.reason}; log:\n{log}"
    report = probe_report(log)
    assert_confined(report, "own scans")
    assert report["pid1_is_docker_init"]  # its own PID namespace, not the host's
    assert KEY_TEXT not in log


# --- kubernetes ----------------------------------------------------------------------------------
SH_PROBE = r"""
m=$1; own=$2; other_data=$3; shift 3
hits=0; pids=0
for f in /proc/[0-9]*/environ; do
  pids=$((pids + 1))
  if grep -q "$m" "$f" 2>/dev/null; then echo "LEAK environ $f"; hits=1; fi
done
grep -q "$m" /proc/1/environ 2>/dev/null && echo "LEAK pid1 environ"
for p in "$other_data" "$@"; do
  if [ -e "$p" ] || [ -S "$p" ]; then echo "LEAK exists $p"; fi
  if cat "$p" >/dev/null 2>&1; then echo "LEAK read $p"; fi
done
echo "PIDS $pids"
echo "OWN $(cat "$own")"
grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\t' | sed 's/^/STATUS /'
"""


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _hostpath_claim(cluster: Cluster, name: str, folder: Path) -> None:
    """A PV on the node's folder (the cluster admin's), bound to a claim in the test namespace."""
    labels = {K8S_LABEL: K8S_SESSION}
    pv = f"atoll-test-{K8S_SESSION}-{name}"
    cluster.api.create_persistent_volume({
        "metadata": {"name": pv, "labels": labels},
        "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadOnlyMany"],
                 "hostPath": {"path": str(folder)}, "storageClassName": ""},
    })
    cluster.api.create_namespaced_persistent_volume_claim(cluster.namespace, {
        "metadata": {"name": name, "labels": labels},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Mi"}}},
    })


@pytest.mark.k8s
def test_hostile_pod_reaches_nothing_of_the_parent(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"parent-marker-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARKER_VAR, marker)
    own, other = dataset(tmp_path, "scans", "own scans"), dataset(tmp_path, "records", "theirs")
    _hostpath_claim(cluster, "confine-own-scans", own)
    _hostpath_claim(cluster, "confine-other-records", other)
    site = {"launcher": "k8s", "k8s": {"namespace": cluster.namespace, "host_network": True,
                                        "python": "sh", "default_image": cluster.busybox}}
    studies = {
        "pathology": {"pod_template": pod_template(),
                      "datasets": {"scans": {"source": "confine-own-scans", "mode": "ro"}}},
        "other": {"datasets": {"records": {"source": "confine-other-records", "mode": "ro"}}},
    }
    kit = write_kit(tmp_path, site, studies)
    config = load_site_config(kit / "local" / "site.yaml")
    runtime = load_study_runtime(kit / "local", "k8s")
    launcher = KubernetesLauncher(config, api=cluster.api)
    engine = cluster.env.get("ATOLL_K8S_DOCKER_HOST", "").removeprefix("unix://")
    paths = targets(kit, other, [s for s in (engine, "/var/run/docker.sock") if s])
    argv = [marker, "/data/pathology/scans/file.txt", "/data/other/records/file.txt",
            *paths.values()]
    script = f"set -- {' '.join(_sh_quote(a) for a in argv)}\n{SH_PROBE}"
    identity = JobIdentity(uuid.uuid4().hex, "confine", "pathology", "site-a", "site")
    request = LaunchRequest(
        identity=identity,
        resources=Resources(memory="64Mi"),
        launcher_spec={"cpu_request": "100m"},
        study_runtime=runtime.entry("pathology"),
        site_config=config,
        workdir=tmp_path / "run",
        parent_address="127.0.0.1:7001",
        credentials={"ATOLL_JOB_TOKEN": "tok-" + uuid.uuid4().hex},
        worker_args=("-c", script),
    )
    pod = launcher.render(request)["pod"]
    assert not any("hostPath" in v for v in pod["spec"]["volumes"])
    result = launcher.wait(launcher.launch(request))
    log = (tmp_path / "run" / "logs" / "worker.log").read_text()
    assert result.outcome is Outcome.COMPLETED, f"{result.reason}; log:\n{log}"
    assert "LEAK" not in log, log
    assert "OWN own scans" in log
    pids = int(re.search(r"^PIDS (\d+)$", log, re.MULTILINE).group(1))
    assert pids < 10, f"the node's processes are visible ({pids}):\n{log}"
    status = dict(line.split()[1].split(":") for line in log.splitlines()
                  if line.startswith("STATUS "))
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    assert marker not in log and KEY_TEXT not in log
