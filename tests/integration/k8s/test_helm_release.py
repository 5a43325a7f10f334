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

import csv
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from tests.integration.federation.harness import (
    PROJECT,
    Federation,
    free_port,
    job_folder,
    project_doc,
)
from tests.integration.federation.jobs import STALL, make_job, round_taker
from tests.integration.k8s.conftest import SESSION_ID, SESSION_LABEL, Cluster
from tests.integration.k8s.helm_support import (
    CHART,
    job_image_tag,
    kit_secret,
    parent_pods,
    release_values,
    run,
    running_pod,
    wait_online,
    wait_until,
)

ADMIN = "admin@helm.test"
SITE = "site-h"
JOB_PODS = "app.kubernetes.io/managed-by=atoll"


def _server_volume(cluster: Cluster, path: Path, storage_class: str) -> None:
    """A hostPath PersistentVolume for the server's claim (the test node has no provisioner)."""
    cluster.api.create_persistent_volume({
        "metadata": {"name": storage_class, "labels": {SESSION_LABEL: SESSION_ID}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(path), "type": "Directory"}},
    })


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


SLOW_ROUNDS = 6
INITIAL = "import numpy as np\n\ndef make():\n    return {'w': np.zeros(4)}\n"


def _fedavg_job(path: Path) -> Path:
    """FedAvg with a checkpoint after each round, whose site takes 8 s a round: long enough
    for the server to be upgraded mid-job."""
    app = ("server:\n  workflow: fedavg\n"
           f"  args: {{num_rounds: {SLOW_ROUNDS}, evaluate_every: 0, cross_site_eval: none, "
           "round_timeout: 300}\n  initial_model: model.py:make\nsite:\n  script: train.py\n")
    meta = {"name": path.name, "deploy_map": {"app": ["@ALL"]},
            "resource_spec": {"@default": {"memory": "512Mi"}},
            "launcher_spec": {"default": {"k8s": {"cpu_request": "100m"}}}}
    return job_folder(path, meta, app, {"train.py": round_taker(8), "model.py": INITIAL})


def _kill_parent_container(cluster: Cluster, pod: str) -> None:
    """SIGKILL the parent's container of ``pod`` in the kubelet's engine (the Pod stays)."""
    import docker

    engine = docker.DockerClient(base_url=cluster.env["ATOLL_K8S_DOCKER_HOST"])
    [container] = engine.containers.list(filters={"label": [
        f"io.kubernetes.pod.name={pod}", "io.kubernetes.container.name=parent"]})
    container.kill("SIGKILL")


def _slow_job_past_round_1(fed: Federation, path: Path, jobs_on_claim: Path) -> str:
    """Submit the slow FedAvg job; its id once its checkpoint of round 1 is on the server's
    claim (its server worker Pod sent it home)."""
    with fed.session(ADMIN) as session:
        job_id = session.submit(_fedavg_job(path))["job_id"]
    held = jobs_on_claim / job_id / "checkpoint-home.zip"
    wait_until(held.is_file, 300, "the checkpoint of round 1 sent home to the server")
    return job_id


def _resumed_once_and_completed(fed: Federation, job_id: str, tmp_path: Path,
                                jobs_on_claim: Path, what: str) -> None:
    """The job resumed once, mid-job, and COMPLETED by itself, each round once per site in
    metrics.csv; the checkpoint the server kept for it is gone with its end."""
    with fed.session(ADMIN) as session:
        final = session.wait(job_id, timeout=600)
        assert final["state"] == "FINISHED:COMPLETED", (final["reason"], final["parts"])
        events = session.logs(job_id)["events"]
        status = session.status(job_id)
        out = session.download(job_id, tmp_path / f"{job_id}-out")
    resumed = [e["round"] for e in events if e.get("event") == "resumed"]
    assert len(resumed) == 1 and 2 <= resumed[0] <= SLOW_ROUNDS, events  # mid-job
    print(f"{what} mid-job: resumed at round {resumed[0]} of {SLOW_ROUNDS}")
    assert f"resumed at round {resumed[0]} after a server restart" in str(status), status
    with open(next(out.rglob("metrics.csv")), newline="") as fh:
        rows = Counter((r["round"], r["site"]) for r in csv.DictReader(fh)
                       if r["phase"] == "train" and r["metric"] == "ok")
    assert rows == Counter({(str(r), site): 1 for r in range(1, SLOW_ROUNDS + 1)
                            for site in (SITE, "global")}), rows
    assert not (jobs_on_claim / job_id / "checkpoint-home.zip").exists()  # gone with the job


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
    kit_secret(cluster, f"server-kit-{SESSION_ID}", fed.kit("server") / "startup")
    kit_secret(cluster, f"site-kit-{SESSION_ID}", fed.kit(SITE) / "startup")
    # The server's job store on a PersistentVolume: a host folder the parent (uid 1000) owns.
    volume_root = Path(tempfile.mkdtemp(prefix="atoll-helm-"))
    volume_root.chmod(0o755)
    (volume_root / "volume").mkdir()
    os.chown(volume_root / "volume", 1000, 1000)
    storage_class = f"atoll-test-{SESSION_ID}"
    _server_volume(cluster, volume_root / "volume", storage_class)

    job_image = job_image_tag(cluster)
    config = helm.Configuration(namespace=ns, kubeconfig=cluster.kubeconfig)
    server_release, site_release = f"fl{SESSION_ID}-server", f"fl{SESSION_ID}-site"
    workspace = {"persistence": True, "size": "1Gi", "storageClassName": storage_class}
    server_values = release_values("server", cluster, parent_image, job_image,
                                   workspace=workspace,
                                   server={"port": port, "service": {"port": port}})
    site_values = release_values("site", cluster, parent_image, job_image)
    pods = PodLog(api, ns)
    try:
        started = time.monotonic()
        run(helm.Install(config).run(server_release, str(CHART), values=server_values, wait=False))
        run(helm.Install(config).run(site_release, str(CHART), values=site_values, wait=False))
        wait_online(fed, ADMIN, cluster, [server_release, site_release], 180)
        print(f"\nhelm install -> site online: {time.monotonic() - started:.1f} s")
        server_pod = wait_until(lambda: running_pod(cluster, server_release), 60,
                                "server Pod ready")
        # The kubelet posts a Pod's status a moment after its container runs, so a site can be
        # online before its Pod reads Running.
        wait_until(lambda: running_pod(cluster, site_release), 60, "site Pod running")
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
        wait_until(lambda: not api.list_namespaced_pod(ns, label_selector=JOB_PODS).items, 60,
              "no job Pod left after the job")

        # A FedAvg job of several slow rounds runs while the server is upgraded: its server
        # worker Pod's checkpoint of round 1 is on the server's claim when the upgrade starts.
        jobs_on_claim = volume_root / "volume" / "workspace" / "jobs"
        slow = _slow_job_past_round_1(fed, tmp_path / "slow", jobs_on_claim)

        # An upgrade replaces the server Pod (its config changed); the job store and kits stay.
        server_values["config"]["site"]["k8s"]["pending_timeout"] = 180
        run(helm.Upgrade(config).run(server_release, str(CHART), values=server_values, wait=False))
        upgraded = wait_until(lambda: (pod := running_pod(cluster, server_release))
                              and pod.metadata.uid != server_pod.metadata.uid and pod,
                              180, "the upgraded server Pod")
        wait_online(fed, ADMIN, cluster, [server_release, site_release], 120)
        with fed.session(ADMIN) as session:
            kept = {j["job_id"]: j["state"] for j in session.list_jobs()}
        assert kept.get(job["job_id"]) == "FINISHED:COMPLETED", kept
        # ... and the job that ran through it ends by itself, every round once
        _resumed_once_and_completed(fed, slow, tmp_path, jobs_on_claim, "helm upgrade")

        # A server parent killed mid-job (SIGKILL, as the OOM killer does: nothing stopped)
        # leaves its server worker Pod behind; the kubelet starts the parent again, which
        # removes that Pod and resumes the job under the same names.
        killed = _slow_job_past_round_1(fed, tmp_path / "killed", jobs_on_claim)
        _kill_parent_container(cluster, upgraded.metadata.name)
        wait_until(lambda: (pod := running_pod(cluster, server_release)) and any(
            c.restart_count for c in pod.status.container_statuses), 180,
            "the server parent started again in its Pod")
        wait_online(fed, ADMIN, cluster, [server_release, site_release], 120)
        _resumed_once_and_completed(fed, killed, tmp_path, jobs_on_claim, "server Pod killed")
        for kit in (f"server-kit-{SESSION_ID}", f"site-kit-{SESSION_ID}"):  # not the chart's
            assert api.read_namespaced_secret(kit, ns).data.keys() >= {"kit.yaml", "rootCA.pem"}
        assert any((volume_root / "volume" / "workspace").iterdir())  # the store is there

        # A job still running when the releases go: uninstall must not leave its Pods behind.
        with fed.session(ADMIN) as session:
            stalled = session.submit(_small_job(tmp_path / "stall", script=STALL))["job_id"]
        wait_until(lambda: [p for p in api.list_namespaced_pod(ns, label_selector=JOB_PODS).items
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
        wait_until(lambda: not (parent_pods(cluster, server_release)
                           or parent_pods(cluster, site_release)), 120, "parent Pods gone")
        shutil.rmtree(volume_root, ignore_errors=True)
    wait_until(lambda: not api.list_namespaced_pod(ns, label_selector=JOB_PODS).items, 60,
          "no job Pod left after uninstall")
    # The claim outlives the release (helm.sh/resource-policy: keep): the job store is data.
    claim = f"{server_release}-workspace"
    assert api.read_namespaced_persistent_volume_claim(claim, ns).status.phase == "Bound"
    api.delete_namespaced_persistent_volume_claim(claim, ns)
