"""What the Helm release test and bench/deploy_start.py share: the chart, values for the test
cluster, kits as Secrets, and waits (the `helm` fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

from atoll.admin.errors import ConnectionFailed
from tests.integration.federation.harness import Federation, free_port
from tests.integration.k8s.conftest import (
    REPO,
    SESSION_ID,
    SESSION_LABEL,
    Cluster,
    pod_template,
)

CHART = REPO / "deploy" / "helm" / "atoll"


def run(coro: Any) -> Any:
    """helm-sdkpy's actions are coroutines."""
    return asyncio.run(coro)


def wait_until(check: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {seconds} s")
        time.sleep(0.25)


def kit_secret(cluster: Cluster, name: str, startup: Path) -> None:
    """The kit's startup/ files as a Secret, as `kubectl create secret generic --from-file`."""
    data = {f.name: base64.b64encode(f.read_bytes()).decode() for f in startup.iterdir()}
    cluster.api.create_namespaced_secret(cluster.namespace, {
        "metadata": {"name": name, "labels": {SESSION_LABEL: SESSION_ID}}, "data": data})


def release_values(role: str, cluster: Cluster, image: str, job_image: str,
                   **extra: Any) -> dict:
    server = cluster.api.api_client.configuration.host.removeprefix("https://")
    host, port = server.rsplit(":", 1)
    repository, tag = image.rsplit(":", 1)
    k8s = {"host_network": True, "default_image": job_image, "python": "python3",
           "pending_timeout": 120}
    return {
        "role": role,
        "kitSecret": f"{role}-kit-{SESSION_ID}",
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "hostNetwork": True,
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": host},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": port}],
        "workerPort": free_port(),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "extraLabels": {SESSION_LABEL: SESSION_ID},
        "config": {"site": {"launcher": "k8s", "k8s": k8s},
                   "studyRuntime": {"format_version": 2,
                                    "studies": {"default": {"pod_template": pod_template()}}}},
        **extra,
    }


def parent_logs(cluster: Cluster, release: str) -> str:
    return "\n".join(
        f"--- {p.metadata.name} ({p.status.phase})\n"
        + cluster.api.read_namespaced_pod_log(p.metadata.name, cluster.namespace, tail_lines=40)
        for p in parent_pods(cluster, release) if p.status.phase != "Pending")


def wait_online(fed: Federation, admin: str, cluster: Cluster, releases: list[str],
                seconds: float) -> None:
    """Until the server answers and sees the site online (its Pod may not be up yet)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fed.wait_online(admin, timeout=max(deadline - time.monotonic(), 1))
            return
        except (ConnectionFailed, TimeoutError) as exc:
            if time.monotonic() > deadline:
                logs = "\n".join(parent_logs(cluster, r) for r in releases)
                raise AssertionError(f"site not online: {exc}\n{logs}") from None
            time.sleep(0.5)


def parent_pods(cluster: Cluster, release: str) -> list[Any]:
    return cluster.api.list_namespaced_pod(
        cluster.namespace, label_selector=f"app.kubernetes.io/instance={release}").items


def running_pod(cluster: Cluster, release: str) -> Any:
    pods = parent_pods(cluster, release)
    ready = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
             and all(c.ready for c in p.status.container_statuses or [])]
    return ready[0] if len(pods) == 1 and ready else None


def job_image_tag(cluster: Cluster) -> str:
    """The job image under a version tag: a Pod without a template (the server's worker) then
    gets Kubernetes' default pull policy IfNotPresent, as with any released image."""
    import docker

    engine = docker.DockerClient(base_url=cluster.env["ATOLL_K8S_DOCKER_HOST"])
    image = engine.images.get(cluster.job_image)
    image.tag("atoll-test/job", tag="helm")
    return "atoll-test/job:helm"
