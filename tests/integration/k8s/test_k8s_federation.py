"""A federated job whose site runs its worker in a Pod of the real cluster.

The server and the site parent are real processes with mutual TLS; the site's launcher is k8s.
The Pod gets the job token from its per-job Secret, dials its parent (host network: the test
node has no pod network), fetches its app through the parent (the Pod shares no folder with
it) and trains with the echo script.
"""

from __future__ import annotations

import json
import os
import subprocess

import yaml

from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job
from tests.integration.federation.provenance_check import verified_launch_entry
from tests.integration.k8s.conftest import Cluster, pod_template
from tests.integration.k8s.helm_support import job_image_tag

ADMIN = "admin@k8s.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]


def test_a_job_completes_with_its_site_worker_in_a_pod(cluster: Cluster, tmp_path) -> None:
    fed = Federation.provisioned(tmp_path / "fed", ["site-k"], USERS)
    site_yaml = {
        "launcher": "k8s",
        "k8s": {"kubeconfig": cluster.kubeconfig, "namespace": cluster.namespace,
                "host_network": True, "default_image": cluster.job_image,
                "python": "python3", "pending_timeout": 120},
    }
    (fed.kit("site-k") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    runtime = {"format_version": 2, "studies": {"default": {"pod_template": pod_template()}}}
    (fed.kit("site-k") / "local" / "study_runtime.yaml").write_text(yaml.safe_dump(runtime))
    job_dir = make_job(tmp_path / "k8s-echo", rounds=2)
    meta = json.loads((job_dir / "meta.json").read_text())
    meta["resource_spec"] = {"@default": {"memory": "512Mi"}}
    meta["launcher_spec"] = {"site-k": {"k8s": {"cpu_request": "100m"}}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as session:
            job = session.submit(job_dir, wait=True, timeout=240)
        assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"],
                                                      fed.log("site-k"))
        launch = verified_launch_entry(fed, ADMIN, job["job_id"], "site-k", tmp_path)
    finally:
        fed.stop_all()
    log = (fed.workspace("site-k") / "jobs" / job["job_id"] / "logs" / "worker.log").read_text()
    assert "registered with 127.0.0.1" in log  # the Pod's own worker log, kept by the launcher
    left = cluster.api.list_namespaced_pod(cluster.namespace).items
    assert not [p.metadata.name for p in left if job["job_id"][:12] in p.metadata.name]
    # its provenance record verifies offline and names the imageID the kubelet gave the Pod's
    # container: the node's engine's id of the job image (the kubelet runs on Docker here)
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", cluster.job_image],
        env={**os.environ, "DOCKER_HOST": cluster.env["ATOLL_K8S_DOCKER_HOST"]},
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert inspected.startswith("sha256:"), inspected
    assert launch["image_id"] in (f"docker://{inspected}", inspected), launch
    assert launch["image"] == cluster.job_image and launch["launcher"] == "k8s"


def test_the_server_workers_results_come_home_from_its_pod(cluster: Cluster, tmp_path) -> None:
    """The server's own workers as Pods too (the chart's default): the workflow's results,
    written into the Pod's emptyDir, reach `atoll job download` (issue 36)."""
    fed = Federation.provisioned(tmp_path / "fed", ["site-k"], USERS)
    # a version tag, as released images have: the server's Pod has no template, so Kubernetes'
    # default pull policy applies (IfNotPresent; ":latest" would be pulled, and nothing can be)
    k8s = {"kubeconfig": cluster.kubeconfig, "namespace": cluster.namespace,
           "host_network": True, "default_image": job_image_tag(cluster), "python": "python3",
           "pending_timeout": 120}
    for name in ("server", "site-k"):
        (fed.kit(name) / "local" / "site.yaml").write_text(
            yaml.safe_dump({"launcher": "k8s", "k8s": k8s}))
    runtime = {"format_version": 2, "studies": {"default": {"pod_template": pod_template()}}}
    (fed.kit("site-k") / "local" / "study_runtime.yaml").write_text(yaml.safe_dump(runtime))
    job_dir = make_job(tmp_path / "k8s-server-pod", rounds=2)
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as session:
            job = session.submit(job_dir, wait=True, timeout=300)
            out = session.download(job["job_id"], tmp_path / "download")
    finally:
        fed.stop_all()
    assert job["state"] == "FINISHED:COMPLETED", (job["reason"], job["parts"], fed.log("server"))
    server_log = (out / "logs" / "server" / "worker.log").read_text()
    assert "registered with" in server_log  # the server worker ran in a Pod: its log came back
    report = json.loads((out / "results" / "scatter_gather.json").read_text())
    assert len(report["rounds"]) == 2, report  # the workflow's own file, written in the Pod
    assert "results sent to the parent" in server_log
