"""What a Pod's status means for its worker: one table from Kubernetes states to atoll's.

Pure: ``interpret`` reads a ``V1Pod`` (as the watch API delivers it) and says whether the worker
has ended (and how), is still pending (which counts against ``pending_timeout``), or runs.
Errors that never heal by waiting fail fast: an image that cannot be pulled, a container that
cannot be configured (a missing Secret key), a crash loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atoll.launchers.base import Outcome, WorkerExit
from atoll.launchers.kubernetes_render import MAIN_CONTAINER

# Waiting reasons that never heal by waiting.
IMAGE_ERRORS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
)
CONFIG_ERRORS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
CRASH_ERRORS = frozenset({"CrashLoopBackOff"})


@dataclass(frozen=True)
class PodState:
    final: WorkerExit | None  # set when the worker has ended or can never start
    pending: bool  # not running yet: counts against pending_timeout
    note: str  # what the site shows meanwhile, e.g. the scheduler's message


def _statuses(pod: Any) -> list[Any]:
    status = pod.status
    return [*(status.init_container_statuses or []), *(status.container_statuses or [])]


def _main_status(pod: Any) -> Any | None:
    return next((s for s in pod.status.container_statuses or [] if s.name == MAIN_CONTAINER), None)


def _memory_limit(pod: Any) -> str | None:
    for container in pod.spec.containers or []:
        if container.name == MAIN_CONTAINER and container.resources and container.resources.limits:
            return container.resources.limits.get("memory")
    return None


def _ended(pod: Any, terminated: Any) -> WorkerExit:
    """A terminated worker container: exit code 0 is success, anything else a failure."""
    code = terminated.exit_code
    if code == 0:
        return WorkerExit(Outcome.COMPLETED, "worker exited with code 0", 0)
    if terminated.reason == "OOMKilled":
        limit = _memory_limit(pod)
        return WorkerExit(Outcome.FAILED, f"out of memory (limit {limit or 'none set'})", code)
    reason = f"worker exited with code {code}"
    if terminated.reason and terminated.reason not in ("Error", "Completed"):
        reason += f" ({terminated.reason})"
    if terminated.message:
        reason += f": {terminated.message.strip()}"
    return WorkerExit(Outcome.FAILED, reason, code)


def _scheduling_problem(pod: Any) -> str | None:
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or condition.reason or "not scheduled"
    return None


def _waiting_failure(pod: Any) -> WorkerExit | None:
    for status in _statuses(pod):
        waiting = status.state.waiting if status.state else None
        if waiting is None or not waiting.reason:
            continue
        message = (waiting.message or "").strip()
        if waiting.reason in IMAGE_ERRORS:
            return WorkerExit(
                Outcome.FAILED,
                f"image {status.image!r} cannot be used ({waiting.reason}): {message or 'no detail'}; "
                "check the image name and that the node can pull it (image_pull_secrets)",
            )
        if waiting.reason in CONFIG_ERRORS:
            return WorkerExit(
                Outcome.FAILED,
                f"container {status.name!r} cannot be created ({waiting.reason}): "
                f"{message or 'no detail'}; check the Secrets and volumes the study maps",
            )
        if waiting.reason in CRASH_ERRORS:
            last = status.last_state.terminated if status.last_state else None
            code = last.exit_code if last else None
            return WorkerExit(
                Outcome.FAILED,
                f"container {status.name!r} crashed repeatedly (CrashLoopBackOff, "
                f"last exit code {code})",
                code,
            )
    return None


def interpret(pod: Any) -> PodState:
    """The worker's state from its Pod."""
    status = pod.status
    phase = status.phase or "Pending"
    main = _main_status(pod)
    terminated = main.state.terminated if main and main.state else None
    if phase == "Succeeded":
        return PodState(WorkerExit(Outcome.COMPLETED, "worker exited with code 0", 0), False, phase)
    if phase == "Failed":
        if terminated is not None:
            return PodState(_ended(pod, terminated), False, phase)
        detail = ": ".join(x for x in (status.reason, status.message) if x) or "no detail"
        return PodState(WorkerExit(Outcome.FAILED, f"pod failed ({detail})"), False, phase)
    if terminated is not None:  # the worker ended while sidecars still run
        return PodState(_ended(pod, terminated), False, phase)
    failure = _waiting_failure(pod)
    if failure is not None:
        return PodState(failure, False, phase)
    if phase == "Running":
        return PodState(None, False, f"running on node {pod.spec.node_name}")
    if phase == "Unknown":
        return PodState(None, False, "the pod's node stopped reporting (phase Unknown)")
    unscheduled = _scheduling_problem(pod)
    if unscheduled:
        return PodState(None, True, f"waiting to be scheduled: {unscheduled}")
    waiting = [
        s.state.waiting.reason
        for s in _statuses(pod)
        if s.state and s.state.waiting and s.state.waiting.reason
    ]
    return PodState(None, True, f"pending ({', '.join(waiting) or 'scheduled'})")
