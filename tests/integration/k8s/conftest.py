"""The real Kubernetes of scripts/backends/k8s.sh, a per-session namespace, and request builders.

Start it once with ``scripts/backends/k8s.sh up`` (the first time builds Kubernetes from Debian's
source package, about 6 minutes; then ~30 s). Without it these tests skip, or fail when
``CI=true``. Every object the tests create is in namespace ``atoll-test-<session>`` or carries the
label ``atoll-test-session=<session>``; teardown deletes by that label and checks nothing is left.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from atoll.launchers.base import JobIdentity, LaunchRequest
from atoll.launchers.kubernetes import KubernetesLauncher
from atoll.spec.resources import Resources
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.integration.backend_env import read_env_file

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "backends" / "k8s.sh"
SESSION_ID = uuid.uuid4().hex[:10]
SESSION_LABEL = "atoll-test-session"
SELECTOR = f"{SESSION_LABEL}={SESSION_ID}"
NAMESPACE = f"atoll-test-{SESSION_ID}"
STUDY = "pathology"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.k8s)


def _cluster_env() -> dict[str, str]:
    return read_env_file("ATOLL_K8S_BASE", "/tmp/atoll-k8s")


@dataclass
class Cluster:
    env: dict[str, str]
    api: Any  # CoreV1Api as cluster admin
    namespace: str

    @property
    def kubeconfig(self) -> str:
        return self.env["KUBECONFIG"]

    @property
    def busybox(self) -> str:
        return self.env["ATOLL_K8S_BUSYBOX_IMAGE"]

    @property
    def job_image(self) -> str:
        """Debian's Python with atoll's wheel (docker/job.Dockerfile), built into the node."""
        return self.env["ATOLL_K8S_JOB_IMAGE"]

    def session_objects(self) -> list[str]:
        """Every pod, Secret, namespace and PV of this session still present, by name."""
        found = [
            f"pod {p.metadata.namespace}/{p.metadata.name}"
            for p in self.api.list_pod_for_all_namespaces(label_selector=SELECTOR).items
        ]
        found += [
            f"secret {s.metadata.namespace}/{s.metadata.name}"
            for s in self.api.list_secret_for_all_namespaces(label_selector=SELECTOR).items
        ]
        found += [
            f"namespace {n.metadata.name}"
            for n in self.api.list_namespace(label_selector=SELECTOR).items
        ]
        found += [
            f"pv {v.metadata.name}"
            for v in self.api.list_persistent_volume(label_selector=SELECTOR).items
        ]
        return found


def _wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {seconds} s")
        time.sleep(0.2)


# The cluster of this session: tests/security reuses this fixture from its own conftest, and
# pytest then sets it up twice; the second gets the first's namespace, the first tears down.
_ACTIVE: list[Cluster] = []


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if _ACTIVE:
        yield _ACTIVE[0]
        return
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        why = f"no test Kubernetes ({status.stderr.strip()}); start it: {SCRIPT} up"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    from kubernetes import client, config

    env = _cluster_env()
    api = client.CoreV1Api(config.new_client_from_config(config_file=env["KUBECONFIG"]))
    labels = {SESSION_LABEL: SESSION_ID}
    api.create_namespace({"metadata": {"name": NAMESPACE, "labels": labels}})
    # Pods are admitted only once the namespace's default ServiceAccount exists.
    _wait_until(
        lambda: any(
            sa.metadata.name == "default"
            for sa in api.list_namespaced_service_account(NAMESPACE).items
        ),
        30,
        "the namespace's default ServiceAccount",
    )
    found = Cluster(env, api, NAMESPACE)
    _ACTIVE.append(found)
    yield found
    _ACTIVE.clear()
    api.delete_collection_namespaced_pod(NAMESPACE, label_selector=SELECTOR, grace_period_seconds=0)
    api.delete_collection_namespaced_secret(NAMESPACE, label_selector=SELECTOR)
    api.delete_collection_persistent_volume(label_selector=SELECTOR)
    api.delete_namespace(NAMESPACE, grace_period_seconds=0)
    _wait_until(lambda: not found.session_objects(), 90, "deletion of the session's objects")
    assert found.session_objects() == []


def pod_template(**container: Any) -> dict[str, Any]:
    """The tests' template: session label, local images only (nothing can be pulled here)."""
    return {
        "kind": "Pod",
        "metadata": {"labels": {SESSION_LABEL: SESSION_ID}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "atoll-worker", "imagePullPolicy": "Never", **container}],
        },
    }


def make_launcher(cluster: Cluster, api: Any = None, **k8s: Any) -> KubernetesLauncher:
    settings = {
        "namespace": cluster.namespace,
        "host_network": True,  # no pod network on the test node; see docs/launchers/kubernetes.md
        "python": "sh",  # busybox has no Python: the launcher runs `sh -c <script>` instead
        "default_image": cluster.busybox,
        **k8s,
    }
    site_config = parse_site_config({"launcher": "k8s", "k8s": settings})
    return KubernetesLauncher(site_config, api=api or cluster.api)


def make_request(
    launcher: KubernetesLauncher,
    script: str,
    workdir: Path,
    *,
    study: dict[str, Any] | None = None,
    resources: Resources | None = None,
    launcher_spec: dict[str, Any] | None = None,
    token: str = "tok-" + uuid.uuid4().hex,
) -> LaunchRequest:
    entry = {"pod_template": pod_template(), **(study or {})}
    runtime = parse_study_runtime({"format_version": 2, "studies": {STUDY: entry}}, "k8s")
    identity = JobIdentity(uuid.uuid4().hex, "k8s-it", STUDY, "site-a", "site")
    return LaunchRequest(
        identity=identity,
        resources=resources or Resources(memory="64Mi"),
        # A tenth of a CPU requested each, no CPU limit (NVIDIA FLARE's cpu_request alone): the
        # 2-CPU test node then never queues the tests' pods.
        launcher_spec={"cpu_request": "100m", **(launcher_spec or {})},
        study_runtime=runtime.entry(STUDY),
        site_config=launcher.site_config,
        workdir=workdir,
        parent_address="127.0.0.1:7001",
        credentials={"ATOLL_JOB_TOKEN": token},
        worker_args=("-c", script),
    )


@pytest.fixture(scope="module")
def helm() -> Any:
    """A real Helm: PyPI helm-sdkpy (tests/requirements-helm.txt), Helm's Go library via cffi."""
    try:
        import helm_sdkpy
    except ImportError:
        why = "helm-sdkpy missing: pip install --ignore-requires-python -r tests/requirements-helm.txt"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return helm_sdkpy
