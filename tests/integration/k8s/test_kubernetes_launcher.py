"""KubernetesLauncher against the real single-node cluster of scripts/backends/k8s.sh.

What every launcher does (exit codes, cancel, unknown handles, resources in the render) is
tests/integration/launchers/test_contract.py. Times are printed (run with -s to see them), never
asserted: the machine is shared.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from atoll.launchers.base import Outcome
from atoll.spec.resources import Resources
from tests.integration.k8s.conftest import (
    SESSION_ID,
    SESSION_LABEL,
    Cluster,
    make_launcher,
    make_request,
)


def gone(call: Any, *args: Any) -> bool:
    try:
        call(*args)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def wait_for(check: Any, seconds: float) -> float:
    """Seconds until ``check()`` holds; AssertionError after ``seconds``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, f"not reached within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_pod_completes_and_its_log_is_saved(cluster: Cluster, tmp_path: Path) -> None:
    launcher = make_launcher(cluster)
    token = "tok-" + uuid.uuid4().hex
    script = (
        'echo "hello from $ATOLL_SITE in $ATOLL_STUDY, parent $ATOLL_PARENT, cwd $(pwd)"; '
        'printf %s "$ATOLL_JOB_TOKEN" | sha256sum'
    )
    request = make_request(launcher, script, tmp_path, token=token)
    start = time.monotonic()
    handle = launcher.launch(request)
    result = launcher.wait(handle)
    print(f"\n[k8s] launch -> COMPLETED in {time.monotonic() - start:.2f} s")
    assert (result.outcome, result.exit_code) == (Outcome.COMPLETED, 0), result.reason
    log = (tmp_path / "logs" / "worker.log").read_text()
    assert "hello from site-a in pathology, parent 127.0.0.1:7001, cwd /atoll/job" in log
    # The token reached the worker through the Secret, and only a hash of it is in the log.
    assert hashlib.sha256(token.encode()).hexdigest() in log and token not in log
    # wait() cleaned up: the pod and its Secret are gone.
    ns = cluster.namespace
    assert gone(cluster.api.read_namespaced_pod, handle.native_id, ns)
    assert gone(cluster.api.read_namespaced_secret, handle.extra["secret"], ns)


def test_a_new_parent_removes_an_earlier_parents_pod_before_it_launches_again(
        cluster: Cluster, tmp_path: Path) -> None:
    """A server parent killed mid-job deletes nothing: its server worker's Pod, Secret and
    NetworkPolicy stay under the names the resumed worker takes. The next parent removes them
    first (``remove_leftovers``), then launches under the same names."""
    earlier = make_launcher(cluster)
    request = make_request(earlier, "sleep 3600", tmp_path)
    old = earlier.launch(request)
    ns, pod, secret = cluster.namespace, old.native_id, old.extra["secret"]
    later = make_launcher(cluster)  # the next parent: nothing of the earlier one's state
    start = time.monotonic()
    later.remove_leftovers(request)
    print(f"\n[k8s] leftovers removed in {time.monotonic() - start:.2f} s")
    assert gone(cluster.api.read_namespaced_pod, pod, ns)
    assert gone(cluster.api.read_namespaced_secret, secret, ns)
    assert gone(later.networking.read_namespaced_network_policy, f"{pod}-net", ns)
    new = later.launch(request)
    try:
        assert new.native_id == pod and new.extra["uid"] != old.extra["uid"]
    finally:
        later.cancel(new)
    later.remove_leftovers(request)  # nothing left: a no-op


def test_python_job_image_runs_atoll_in_a_pod(cluster: Cluster, tmp_path: Path) -> None:
    launcher = make_launcher(cluster, python="python3", default_image=cluster.job_image)
    script = (
        "import os, sys, atoll.worker; "
        "print('atoll on', sys.version_info[:2], 'for', os.environ['ATOLL_SITE'], "
        "'data', os.environ['ATOLL_DATA_ROOT'], 'token', len(os.environ['ATOLL_JOB_TOKEN']))"
    )
    request = make_request(launcher, script, tmp_path, token="t" * 40)
    result = launcher.wait(launcher.launch(request))
    assert result.outcome is Outcome.COMPLETED, result.reason
    log = (tmp_path / "logs" / "worker.log").read_text()
    assert "atoll on (3, 11) for site-a data /data/pathology token 40" in log


def _dataset_and_secret(cluster: Cluster, tmp_path: Path) -> dict[str, Any]:
    """A read-only PVC bound to a hostPath PV, and the study's DB Secret (test-created)."""
    labels = {SESSION_LABEL: SESSION_ID}
    slides = tmp_path / "slides"
    slides.mkdir()
    (slides / "slide-1.txt").write_text("tumour")
    pv = f"atoll-test-{SESSION_ID}-slides"
    cluster.api.create_persistent_volume(
        {
            "metadata": {"name": pv, "labels": labels},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadOnlyMany"],
                "hostPath": {"path": str(slides)},
                "storageClassName": "",
            },
        }
    )
    cluster.api.create_namespaced_persistent_volume_claim(
        cluster.namespace,
        {
            "metadata": {"name": "pathology-data-pvc", "labels": labels},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "resources": {"requests": {"storage": "1Mi"}},
                "storageClassName": "",
                "volumeName": pv,
            },
        },
    )
    db = {"username": "reader", "password": "pw-" + uuid.uuid4().hex}
    cluster.api.create_namespaced_secret(
        cluster.namespace,
        {
            "metadata": {"name": "pathology-db", "labels": labels},
            "stringData": db,
        },
    )
    return db


def test_pod_is_as_rendered_with_ro_pvc_and_secret_refs(cluster: Cluster, tmp_path: Path) -> None:
    db = _dataset_and_secret(cluster, tmp_path)
    launcher = make_launcher(cluster)
    study = {
        "datasets": {"slides": {"source": "pathology-data-pvc", "mode": "ro"}},
        "secret_env": {
            "DB_USER": {"source": "pathology-db", "key": "username"},
            "DB_PASSWORD": {"source": "pathology-db", "key": "password"},
        },
    }
    script = (
        "cat /data/pathology/slides/slide-1.txt; echo; echo user=$DB_USER; "
        'printf %s "$DB_PASSWORD" | sha256sum; '
        "touch /data/pathology/slides/new 2>/dev/null && echo WRITABLE || echo read-only"
    )
    request = make_request(
        launcher,
        script,
        tmp_path / "run",
        study=study,
        resources=Resources(memory="64Mi", num_of_gpus=1),
    )
    rendered = launcher.render(request)["pod"]
    handle = launcher.launch(request)
    live = cluster.api.read_namespaced_pod(handle.native_id, cluster.namespace)
    spec = ApiClient().sanitize_for_serialization(live.spec)
    main = next(c for c in spec["containers"] if c["name"] == "atoll-worker")
    want = next(c for c in rendered["spec"]["containers"] if c["name"] == "atoll-worker")
    assert (
        main["resources"]
        == want["resources"]
        == {
            # cpu_request alone: a request and no CPU limit, as NVIDIA FLARE 2.9 renders it
            "requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "64Mi", "nvidia.com/gpu": "1"},
        }
    )
    assert [m for m in main["volumeMounts"] if m["mountPath"].startswith("/data")] == [
        {"name": "atoll-data-slides", "mountPath": "/data/pathology/slides", "readOnly": True}
    ]
    claim = next(v for v in spec["volumes"] if v["name"] == "atoll-data-slides")
    assert claim["persistentVolumeClaim"] == {"claimName": "pathology-data-pvc", "readOnly": True}
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in main["env"] if "valueFrom" in e}
    assert refs["DB_USER"] == {"name": "pathology-db", "key": "username"}
    assert refs["DB_PASSWORD"] == {"name": "pathology-db", "key": "password"}
    assert refs["ATOLL_JOB_TOKEN"]["name"] == handle.extra["secret"]
    whole = json.dumps(ApiClient().sanitize_for_serialization(live))
    for value in (db["password"], request.credentials["ATOLL_JOB_TOKEN"]):
        assert value not in whole
    # The per-job Secret is owned by the pod, so Kubernetes deletes it with the pod.
    secret = cluster.api.read_namespaced_secret(handle.extra["secret"], cluster.namespace)
    assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [
        ("Pod", live.metadata.uid)
    ]

    result = launcher.wait(handle)
    assert result.outcome is Outcome.COMPLETED, result.reason
    log = (tmp_path / "run" / "logs" / "worker.log").read_text()
    assert "tumour" in log and "user=reader" in log and "read-only" in log
    assert hashlib.sha256(db["password"].encode()).hexdigest() in log


def test_gpus_above_capacity_fail_after_pending_timeout(cluster: Cluster, tmp_path: Path) -> None:
    launcher = make_launcher(cluster, pending_timeout=3)
    request = make_request(
        launcher, "echo never", tmp_path, resources=Resources(num_of_gpus=3)
    )
    notes: list[str] = []
    start = time.monotonic()
    handle = launcher.launch(request, on_progress=notes.append)
    result = launcher.wait(handle)
    print(f"\n[k8s] 3-GPU pod failed after {time.monotonic() - start:.2f} s (pending_timeout 3 s)")
    assert result.outcome is Outcome.FAILED
    assert "pending_timeout" in result.reason
    assert "Insufficient nvidia.com/gpu" in result.reason, result.reason
    assert any("waiting to be scheduled" in n for n in notes)
    assert gone(cluster.api.read_namespaced_pod, handle.native_id, cluster.namespace)


def test_missing_image_fails_fast_naming_it(cluster: Cluster, tmp_path: Path) -> None:
    image = f"atoll-test/no-such-image:{SESSION_ID}"
    launcher = make_launcher(cluster, default_image=image)
    request = make_request(launcher, "true", tmp_path)
    start = time.monotonic()
    result = launcher.wait(launcher.launch(request))
    print(f"\n[k8s] missing image failed in {time.monotonic() - start:.2f} s")
    assert result.outcome is Outcome.FAILED
    assert image in result.reason and "ErrImageNeverPull" in result.reason


def test_missing_namespace_is_explained(cluster: Cluster, tmp_path: Path) -> None:
    from atoll.launchers.base import LaunchError

    launcher = make_launcher(cluster, namespace=f"atoll-test-{SESSION_ID}-absent")
    with pytest.raises(LaunchError, match="does not exist; check k8s.namespace"):
        launcher.launch(make_request(launcher, "true", tmp_path))


def test_quota_refusal_is_explained_and_the_secret_removed(
    cluster: Cluster, tmp_path: Path
) -> None:
    from atoll.launchers.base import LaunchError

    ns = f"atoll-test-{SESSION_ID}-quota"
    labels = {SESSION_LABEL: SESSION_ID}
    api = cluster.api
    api.create_namespace({"metadata": {"name": ns, "labels": labels}})
    try:
        wait_for(lambda: bool(api.list_namespaced_service_account(ns).items), 30)
        quota = {"metadata": {"name": "no-pods", "labels": labels}, "spec": {"hard": {"pods": "0"}}}
        api.create_namespaced_resource_quota(ns, quota)
        wait_for(lambda: api.read_namespaced_resource_quota("no-pods", ns).status.hard, 30)
        launcher = make_launcher(cluster, namespace=ns)
        request = make_request(launcher, "true", tmp_path)
        with pytest.raises(LaunchError, match="ResourceQuota") as err:
            launcher.launch(request)
        assert "exceeded quota" in str(err.value)
        job = f"atoll.dev/job-id={request.identity.job_id}"
        assert not api.list_namespaced_secret(ns, label_selector=job).items
    finally:
        api.delete_namespace(ns)


def test_flare_cpu_limit_with_a_lower_request_is_kept_by_the_api(
    cluster: Cluster, tmp_path: Path
) -> None:
    """NVIDIA FLARE 2.9's launcher_spec k8s {cpu, cpu_request, memory}: the limit, a lower
    request and a memory limit that is also the request, as the API server stores them."""
    launcher = make_launcher(cluster)
    spec = {"cpu": "500m", "cpu_request": "100m", "memory": "96Mi"}
    request = make_request(launcher, "echo done", tmp_path, launcher_spec=spec,
                           resources=Resources())
    handle = launcher.launch(request)
    try:
        live = cluster.api.read_namespaced_pod(handle.native_id, cluster.namespace)
        main = next(c for c in live.spec.containers if c.name == "atoll-worker")
        assert ApiClient().sanitize_for_serialization(main.resources) == {
            "requests": {"cpu": "100m", "memory": "96Mi"},
            "limits": {"cpu": "500m", "memory": "96Mi"},
        }
        assert launcher.wait(handle).outcome is Outcome.COMPLETED
    finally:
        launcher.cancel(handle)
