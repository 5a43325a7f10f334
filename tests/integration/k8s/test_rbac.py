"""deploy/k8s/rbac.yaml is enough for the launcher, and no more than it needs.

The launcher runs with the token of the ServiceAccount that file creates, against the real API
server (RBAC authorization on): launch, watch, logs, cancel all work; reading Secrets does not.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from atoll.launchers.base import LaunchError, Outcome
from atoll.launchers.kubernetes import explain_api_error
from tests.integration.k8s.conftest import (
    REPO,
    SESSION_ID,
    SESSION_LABEL,
    Cluster,
    make_launcher,
    make_request,
)

RBAC_FILE = REPO / "deploy" / "k8s" / "rbac.yaml"


def _apply_rbac(cluster: Cluster) -> None:
    rbac = client.RbacAuthorizationV1Api(cluster.api.api_client)
    for doc in yaml.safe_load_all(RBAC_FILE.read_text()):
        doc["metadata"].setdefault("labels", {})[SESSION_LABEL] = SESSION_ID
        create = {
            "ServiceAccount": cluster.api.create_namespaced_service_account,
            "Role": rbac.create_namespaced_role,
            "RoleBinding": rbac.create_namespaced_role_binding,
        }[doc["kind"]]
        create(cluster.namespace, doc)


def _service_account_api(cluster: Cluster) -> Any:
    """A CoreV1Api authenticated as ServiceAccount atoll-parent (its token Secret, v1.20)."""
    deadline = time.monotonic() + 30
    while True:
        sa = cluster.api.read_namespaced_service_account("atoll-parent", cluster.namespace)
        if sa.secrets:
            break
        assert time.monotonic() < deadline, "no token Secret for atoll-parent"
        time.sleep(0.2)
    secret = cluster.api.read_namespaced_secret(sa.secrets[0].name, cluster.namespace)
    admin = cluster.api.api_client.configuration
    configuration = client.Configuration()
    configuration.host = admin.host
    configuration.ssl_ca_cert = admin.ssl_ca_cert
    configuration.api_key = {"authorization": base64.b64decode(secret.data["token"]).decode()}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.CoreV1Api(client.ApiClient(configuration))


@pytest.fixture(scope="module")
def parent_api(cluster: Cluster) -> Any:
    _apply_rbac(cluster)
    return _service_account_api(cluster)


def test_role_suffices_for_launch_wait_logs(
    cluster: Cluster, parent_api: Any, tmp_path: Path
) -> None:
    launcher = make_launcher(cluster, api=parent_api)
    result = launcher.wait(launcher.launch(make_request(launcher, "echo as-the-parent", tmp_path)))
    assert result.outcome is Outcome.COMPLETED, result.reason
    assert "as-the-parent" in (tmp_path / "logs" / "worker.log").read_text()


def test_role_suffices_for_cancel(cluster: Cluster, parent_api: Any, tmp_path: Path) -> None:
    launcher = make_launcher(cluster, api=parent_api)
    handle = launcher.launch(make_request(launcher, "sleep 300", tmp_path))
    launcher.cancel(handle)
    launcher.cancel(handle)
    assert launcher.wait(handle).outcome is Outcome.ABORTED


def test_role_grants_no_secret_reads_and_the_refusal_is_explained(
    cluster: Cluster, parent_api: Any, tmp_path: Path
) -> None:
    with pytest.raises(ApiException) as err:
        parent_api.list_namespaced_secret(cluster.namespace)
    assert err.value.status == 403
    assert "RBAC Role" in explain_api_error(err.value, "list Secrets", cluster.namespace)
    # Outside its namespace the Role grants nothing: launching there is refused with the hint.
    launcher = make_launcher(cluster, api=parent_api, namespace="default")
    with pytest.raises(LaunchError, match="check the RBAC Role"):
        launcher.launch(make_request(launcher, "true", tmp_path))
