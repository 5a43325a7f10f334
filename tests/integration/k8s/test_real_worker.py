"""The real ``python -m atoll.worker`` in a Pod reaches a real WorkerLink endpoint of its parent.

The job token travels only through the per-job Secret (``secretKeyRef``); the endpoint accepts it
once. The run folder is not shared with the Pod, so the worker asks its parent for its app; this
test's parent has none to give, and the worker reports that failure to it. The whole path of a
federated job on a Kubernetes site is in test_k8s_federation.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from atoll.launchers.base import Outcome
from atoll.parent.worker_endpoint import BackendError, WorkerTokens, start_worker_endpoint
from tests.integration.k8s.conftest import Cluster, make_launcher, make_request


class RecordingBackend:
    """A parent's side of WorkerLink that records what its worker did."""

    def __init__(self) -> None:
        self.registered: list[str] = []
        self.finished: list[tuple[str, bool, str]] = []
        self.done = threading.Event()

    def on_register(self, job_id: str) -> dict[str, Any]:
        self.registered.append(job_id)
        return {"site": "site-a"}

    def finish(self, job_id: str, ok: bool, error: str) -> None:
        self.finished.append((job_id, ok, error))
        self.done.set()

    def report(self, job_id: str, body: dict[str, Any]) -> None:
        pass

    def _refuse(self, *args: Any) -> Any:
        raise BackendError("not part of this test")

    def app_zip(self, job_id: str) -> Any:
        raise BackendError("this test parent has no app to give")

    send_task = next_reply = next_task = send_reply = _refuse


def test_worker_in_a_pod_registers_with_its_token(cluster: Cluster, tmp_path: Path) -> None:
    tokens, backend = WorkerTokens(), RecordingBackend()
    endpoint = start_worker_endpoint(tokens, backend, "127.0.0.1", 0)
    address = endpoint.address
    try:
        launcher = make_launcher(cluster, python="python3", default_image=cluster.job_image)
        request = make_request(launcher, "", tmp_path)
        token = tokens.issue(request.identity.job_id)
        request = type(request)(
            **{
                **request.__dict__,
                "parent_address": address,
                "credentials": {"ATOLL_JOB_TOKEN": token},
                "worker_args": ("-m", "atoll.worker"),
            }
        )
        result = launcher.wait(launcher.launch(request))
    finally:
        endpoint.stop(1)
    job_id = request.identity.job_id
    assert backend.registered == [job_id]
    assert [(j, ok) for j, ok, _ in backend.finished] == [(job_id, False)]
    assert "this test parent has no app to give" in backend.finished[0][2]
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, 1)
    log = (tmp_path / "logs" / "worker.log").read_text()
    assert f"job {job_id} role site registered with {address}" in log
    assert token not in log
    assert tokens.exchange(job_id, token) is None  # spent: a second use is refused
