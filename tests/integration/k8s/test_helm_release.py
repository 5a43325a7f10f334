"""A Helm release of deploy/helm/atoll that trains, on the real cluster of scripts/backends/k8s.sh.

`helm install` (PyPI helm-sdkpy) brings up a server parent Pod and a site parent Pod from the
parent image built into the kubelet's engine; each reads its startup kit from a Secret. The
site parent creates its job worker Pod in-cluster under the chart's ServiceAccount and Role, and
a federated job completes. `helm upgrade` replaces the server Pod and keeps its job store (a
PersistentVolumeClaim) and the kits; `helm uninstall` leaves no parent or job Pod behind.

The test node has no CNI and no kube-proxy (docs/deploy-kubernetes.md, "The test cluster"): the
parents and job Pods use the host network, the site dials the server at the node's address (the
server's Service is installed and its endpoints checked), and the parents reach the API server at
127.0.0.1 instead of the `kubernetes` Service's unrouted address.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from atoll.admin.errors import ConnectionFailed
from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from tests.integration.federation.harness import PROJECT, Federation, free_port, project_doc
from tests.integration.federation.jobs import STALL, make_job
from tests.integration.k8s.conftest import SESSION_ID, SESSION_LABEL, Cluster, pod_template
from tests.integration.k8s.helm_support import CHART, run

ADMIN = "admin@helm.test"
SITE = "site-h"
JOB_PODS = "app.kubernetes.io/managed-by=atoll"


def _wait(check: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {seconds} s")
        time.sleep(0.25)


def _kit_secret(cluster: Cluster, name: str, startup: Path) -> None:
    """The kit's startup/ files as a Secret, as `kubectl create secret generic --from-file`."""
    data = {f.name: base64.b64encode(f.read_bytes()).decode() for f in startup.iterdir()}
    cluster.api.create_namespaced_secret(cluster.namespace, {
        "metadata": {"name": name, "labels": {SESSION_LABEL: SESSION_ID}}, "data": data})


def _server_volume(cluster: Cluster, path: Path, storage_class: str) -> None:
    """A hostPath PersistentVolume for the server's claim (the test node has no provisioner)."""
    cluster.api.create_persistent_volume({
        "metadata": {"name": storage_class, "labels": {SESSION_LABEL: SESSION_ID}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(path), "type": "Directory"}},
    })


def _values(role: str, cluster: Cluster, image: str, job_image: str, **extra: Any) -> dict:
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


class PodLog:
    """Every job Pod the cluster reports while a job runs (they are deleted when it ends)."""

    def __init__(self, api: Any, namespace: str):
        self.seen: dict[str, Any] = {}
        self._stopped = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._follow, args=(api, namespace), daemon=True)
        self._thread.start()

    def _follow(self, api: Any, namespace: str) -> None:
        try:
            for event in self._watch.stream(api.list_namespaced_pod, namespace,
                                            label_selector=JOB_PODS, timeout_seconds=600):
                self.seen.setdefault(event["object"].metadata.name, event["object"])
        except Exception:  # noqa: BLE001 - stop() closes the stream under the reader
            if not self._stopped:
                raise

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def _logs(cluster: Cluster, release: str) -> str:
    return "\n".join(
        f"--- {p.metadata.name} ({p.status.phase})\n"
        + cluster.api.read_namespaced_pod_log(p.metadata.name, cluster.namespace, tail_lines=40)
        for p in _parent_pods(cluster, release) if p.status.phase != "Pending")


def _wait_online(fed: Federation, cluster: Cluster, releases: list[str], seconds: float) -> None:
    """Until the server answers and sees the site online (its Pod may not be up yet)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fed.wait_online(ADMIN, timeout=max(deadline - time.monotonic(), 1))
            return
        except (ConnectionFailed, TimeoutError) as exc:
            if time.monotonic() > deadline:
                logs = "\n".join(_logs(cluster, r) for r in releases)
                raise AssertionError(f"site not online: {exc}\n{logs}") from None
            time.sleep(0.5)


def _parent_pods(cluster: Cluster, release: str) -> list[Any]:
    return cluster.api.list_namespaced_pod(
        cluster.namespace, label_selector=f"app.kubernetes.io/instance={release}").items


def _running(cluster: Cluster, release: str) -> Any:
    pods = _parent_pods(cluster, release)
    ready = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
             and all(c.ready for c in p.status.container_statuses or [])]
    return ready[0] if len(pods) == 1 and ready else None


def _allowed(cluster: Cluster, user: str, verb: str, resource: str, namespace: str | None) -> bool:
    review = client.AuthorizationV1Api(cluster.api.api_client).create_subject_access_review({
        "spec": {"user": user, "resourceAttributes": {
            "verb": verb, "resource": resource, "namespace": namespace}}})
    return bool(review.status.allowed)


def _small_job(path: Path, **how: Any) -> Path:
    """A job whose two worker Pods fit the 2-CPU test node beside the parents."""
    job_dir = make_job(path, **how)
    meta = json.loads((job_dir / "meta.json").read_text())
    meta["resource_spec"] = {"@default": {"memory": "512Mi"}}
    meta["launcher_spec"] = {"default": {"k8s": {"cpu_request": "100m"}}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    return job_dir


def _job_image(cluster: Cluster) -> str:
    """The job image under a version tag: a Pod without a template (the server's worker) then
    gets Kubernetes' default pull policy IfNotPresent, as with any released image."""
    import docker

    engine = docker.DockerClient(base_url=cluster.env["ATOLL_K8S_DOCKER_HOST"])
    image = engine.images.get(cluster.job_image)
    image.tag("atoll-test/job", tag="helm")
    return "atoll-test/job:helm"


def test_helm_release_trains_upgrades_and_uninstalls(helm: Any, cluster: Cluster,
                                                     tmp_path: Path) -> None:
    parent_image = cluster.env.get("ATOLL_K8S_PARENT_IMAGE")
    if not parent_image:
        why = 'no parent image in the cluster: ATOLL_K8S_IMAGES="busybox job parent" k8s.sh images'
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    ns, api = cluster.namespace, cluster.api
    port = free_port()  # the server's, on the node's network
    doc = project_doc(port, [SITE], [{"name": ADMIN, "org": "test", "role": "project_admin"}])
    provision(parse_project(doc, "test"), tmp_path)
    fed = Federation(tmp_path / PROJECT, [SITE])
    _kit_secret(cluster, f"server-kit-{SESSION_ID}", fed.kit("server") / "startup")
    _kit_secret(cluster, f"site-kit-{SESSION_ID}", fed.kit(SITE) / "startup")
    # The server's job store on a PersistentVolume: a host folder the parent (uid 1000) owns.
    volume_root = Path(tempfile.mkdtemp(prefix="atoll-helm-"))
    volume_root.chmod(0o755)
    (volume_root / "volume").mkdir()
    os.chown(volume_root / "volume", 1000, 1000)
    storage_class = f"atoll-test-{SESSION_ID}"
    _server_volume(cluster, volume_root / "volume", storage_class)

    job_image = _job_image(cluster)
    config = helm.Configuration(namespace=ns, kubeconfig=cluster.kubeconfig)
    server_release, site_release = f"fl{SESSION_ID}-server", f"fl{SESSION_ID}-site"
    workspace = {"persistence": True, "size": "1Gi", "storageClassName": storage_class}
    server_values = _values("server", cluster, parent_image, job_image, workspace=workspace,
                            server={"port": port, "service": {"port": port}})
    site_values = _values("site", cluster, parent_image, job_image)
    pods = PodLog(api, ns)
    try:
        started = time.monotonic()
        run(helm.Install(config).run(server_release, str(CHART), values=server_values, wait=False))
        run(helm.Install(config).run(site_release, str(CHART), values=site_values, wait=False))
        _wait_online(fed, cluster, [server_release, site_release], 180)
        print(f"\nhelm install -> site online: {time.monotonic() - started:.1f} s")
        server_pod = _wait(lambda: _running(cluster, server_release), 60, "server Pod ready")
        assert _running(cluster, site_release)
        # The server's Service selects the server Pod's grpc port. (The test node routes no
        # Service, and its endpoints controller refuses the Pod's loopback address.)
        service = api.read_namespaced_service(server_release, ns)
        assert service.spec.selector.items() <= server_pod.metadata.labels.items()
        [grpc] = service.spec.ports
        assert (grpc.port, grpc.target_port) == (port, "grpc")
        assert [(p.name, p.container_port) for p in server_pod.spec.containers[0].ports
                if p.name == "grpc"] == [("grpc", port)]

        # Least privilege: the site parent's ServiceAccount manages Pods here, and nothing else.
        account = f"system:serviceaccount:{ns}:{site_release}"
        assert _allowed(cluster, account, "create", "pods", ns)
        assert _allowed(cluster, account, "delete", "secrets", ns)
        assert not _allowed(cluster, account, "get", "secrets", ns)
        assert not _allowed(cluster, account, "create", "pods", "default")
        assert not _allowed(cluster, account, "list", "nodes", None)

        with fed.session(ADMIN) as session:
            job = session.submit(_small_job(tmp_path / "echo", rounds=2), wait=True, timeout=300)
        assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"])
        workers = {p.metadata.labels["atoll.dev/role"]: p for p in pods.seen.values()
                   if p.metadata.labels.get("atoll.dev/job-id") == job["job_id"]}
        assert sorted(workers) == ["server", "site"]
        assert workers["site"].metadata.labels["atoll.dev/site"] == SITE
        # The NetworkPolicy installed for the site's job Pods selects the Pod that ran.
        policy = client.NetworkingV1Api(api.api_client).read_namespaced_network_policy(
            f"{site_release}-jobs", ns)
        assert policy.spec.policy_types == ["Ingress", "Egress"] and not policy.spec.ingress
        assert policy.spec.pod_selector.match_labels.items() <= (
            workers["site"].metadata.labels.items())
        [rule] = policy.spec.egress
        assert [p.port for p in rule.ports] == [site_values["workerPort"]]
        _wait(lambda: not api.list_namespaced_pod(ns, label_selector=JOB_PODS).items, 60,
              "no job Pod left after the job")

        # An upgrade replaces the server Pod (its config changed); the job store and kits stay.
        server_values["config"]["site"]["k8s"]["pending_timeout"] = 180
        run(helm.Upgrade(config).run(server_release, str(CHART), values=server_values, wait=False))
        _wait(lambda: (pod := _running(cluster, server_release)) and pod.metadata.uid != (
            server_pod.metadata.uid), 180, "the upgraded server Pod")
        _wait_online(fed, cluster, [server_release, site_release], 120)
        with fed.session(ADMIN) as session:
            kept = {j["job_id"]: j["state"] for j in session.list_jobs()}
        assert kept.get(job["job_id"]) == "FINISHED:COMPLETED", kept
        assert any((volume_root / "volume" / "workspace").iterdir())  # the store is there

        # A job still running when the releases go: uninstall must not leave its Pods behind.
        with fed.session(ADMIN) as session:
            stalled = session.submit(_small_job(tmp_path / "stall", script=STALL))["job_id"]
        _wait(lambda: [p for p in api.list_namespaced_pod(ns, label_selector=JOB_PODS).items
                       if p.metadata.labels.get("atoll.dev/job-id") == stalled
                       and p.metadata.labels.get("atoll.dev/role") == "site"
                       and p.status.phase == "Running"], 120, "the stalled job's site Pod")
    finally:
        pods.stop()
        for release in (site_release, server_release):
            try:
                run(helm.Uninstall(config).run(release, wait=True, timeout=120))
            except helm.HelmError:
                pass  # never installed
        _wait(lambda: not (_parent_pods(cluster, server_release)
                           or _parent_pods(cluster, site_release)), 120, "parent Pods gone")
    _wait(lambda: not api.list_namespaced_pod(ns, label_selector=JOB_PODS).items, 60,
          "no job Pod left after uninstall")
    # The claim outlives the release (helm.sh/resource-policy: keep): the job store is data.
    claim = f"{server_release}-workspace"
    assert api.read_namespaced_persistent_volume_claim(claim, ns).status.phase == "Bound"
    api.delete_namespaced_persistent_volume_claim(claim, ns)
    shutil.rmtree(volume_root, ignore_errors=True)
