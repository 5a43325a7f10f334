"""Pod states as the watch API delivers them -> outcomes, and API errors -> hints (pure)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client import ApiClient

from atoll.launchers.base import Outcome
from atoll.launchers.kubernetes import explain_api_error
from atoll.launchers.kubernetes_render import MAIN_CONTAINER
from atoll.launchers.kubernetes_states import interpret


def pod_model(status: dict[str, Any]) -> Any:
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": MAIN_CONTAINER, "resources": {"limits": {"memory": "64Gi"}}}]
        },
        "status": status,
    }
    return ApiClient()._ApiClient__deserialize(pod, "V1Pod")


def container(state: dict[str, Any], image: str = "img:1") -> dict[str, Any]:
    return {
        "name": MAIN_CONTAINER,
        "image": image,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": state,
    }


def test_states_map_to_outcomes() -> None:
    done = interpret(pod_model({"phase": "Succeeded"}))
    assert done.final is not None and done.final.outcome is Outcome.COMPLETED
    oom = interpret(
        pod_model(
            {
                "phase": "Failed",
                "containerStatuses": [
                    container({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
                ],
            }
        )
    )
    assert oom.final is not None and oom.final.reason == "out of memory (limit 64Gi)"
    assert oom.final.exit_code == 137
    pulled = interpret(
        pod_model(
            {
                "phase": "Pending",
                "containerStatuses": [
                    container(
                        {"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}},
                        image="nope:1",
                    )
                ],
            }
        )
    )
    assert pulled.final is not None and "'nope:1'" in pulled.final.reason
    unscheduled = interpret(
        pod_model(
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                    }
                ],
            }
        )
    )
    assert unscheduled.final is None and unscheduled.pending
    assert "Insufficient nvidia.com/gpu" in unscheduled.note


class FakeApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason, self.body = status, "", json.dumps(body)


def test_api_errors_become_hints() -> None:
    forbidden = FakeApiError(403, {"message": 'pods is forbidden: User "x" cannot create'})
    assert "RBAC Role" in explain_api_error(forbidden, "create the worker Pod", "fl")
    quota = FakeApiError(403, {"message": "exceeded quota: compute, requested: cpu=4"})
    assert "ResourceQuota" in explain_api_error(quota, "create the worker Pod", "fl")
    missing = FakeApiError(404, {"message": "x", "details": {"kind": "namespaces"}})
    assert "check k8s.namespace" in explain_api_error(missing, "create the job's Secret", "fl")
    assert "did not answer" in explain_api_error(OSError("refused"), "create", "fl")


def test_config_errors_evictions_and_sidecars() -> None:
    missing_key = interpret(
        pod_model(
            {
                "phase": "Pending",
                "containerStatuses": [
                    container(
                        {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": 'secret "pathology-db" not found',
                            }
                        }
                    )
                ],
            }
        )
    )
    assert missing_key.final is not None
    assert 'secret "pathology-db" not found' in missing_key.final.reason
    evicted = interpret(
        pod_model({"phase": "Failed", "reason": "Evicted", "message": "low on ephemeral-storage"})
    )
    assert evicted.final is not None
    assert evicted.final.reason == "pod failed (Evicted: low on ephemeral-storage)"
    # The worker ended while a sidecar still runs: the worker's exit decides.
    sidecar = interpret(
        pod_model(
            {
                "phase": "Running",
                "containerStatuses": [container({"terminated": {"exitCode": 0}})],
            }
        )
    )
    assert sidecar.final is not None and sidecar.final.outcome is Outcome.COMPLETED
    running = interpret(
        pod_model({"phase": "Running", "containerStatuses": [container({"running": {}})]})
    )
    assert running.final is None and not running.pending
