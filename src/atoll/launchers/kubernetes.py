"""The Kubernetes launcher: one Pod per job worker, watched through the watch API.

``render`` is pure (``kubernetes_render``); launch, wait and cancel go through one injected
``kubernetes.client.CoreV1Api``. The worker's credentials travel only in a per-job Secret,
created just before the Pod and then owned by it, so that Kubernetes deletes it with the Pod.

Errors: every ``ApiException`` or connection failure becomes a ``LaunchError`` at one boundary,
``explain_api_error``, with the hint a site operator needs (403: the RBAC Role; 404 on the
namespace: site.yaml's namespace; quota: the namespace's ResourceQuota).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from atoll.launchers.base import (
    RENDER_DIGEST,
    Handle,
    Launcher,
    LaunchError,
    LaunchRequest,
    Outcome,
    ProgressCallback,
    WorkerExit,
    render_digest,
)
from atoll.launchers.kubernetes_render import MAIN_CONTAINER, render
from atoll.launchers.kubernetes_states import interpret

log = logging.getLogger(__name__)
IMAGE_POLL_SECONDS = 0.5  # how often a starting Pod is read for its container's imageID
WATCH_SECONDS = 300  # longest single watch request; the watch is reopened after it
LOG_CHUNK = 64 * 1024
LEFTOVER_SECONDS = 120  # how long an earlier worker's Pod may take to go (a finalizer...)


def explain_api_error(err: Exception, action: str, namespace: str) -> str:
    """One sentence a site operator can act on, for a failed API call."""
    status = getattr(err, "status", None)
    if status is None:  # no answer at all: urllib3 connection errors and the like
        return (
            f"cannot {action}: the Kubernetes API server did not answer ({err}); check "
            "k8s.kubeconfig / k8s.context (or in_cluster) in site.yaml"
        )
    try:
        body = json.loads(getattr(err, "body", None) or "{}")
    except ValueError:
        body = {}
    message = body.get("message") or getattr(err, "reason", "") or ""
    kind = (body.get("details") or {}).get("kind")
    where = f"in namespace {namespace!r}"
    if status == 403 and "exceeded quota" in message:
        return (
            f"cannot {action} {where}: a ResourceQuota refused it ({message}); check the "
            f"namespace's quotas (kubectl describe quota -n {namespace}) or ask for less"
        )
    if status == 403:
        return (
            f"cannot {action} {where}: forbidden ({message}); check the RBAC Role bound to the "
            "site parent's service account (deploy/k8s/rbac.yaml lists what it needs)"
        )
    if status == 401:
        return (
            f"cannot {action}: the API server rejected atoll's credentials; check "
            "k8s.kubeconfig / k8s.context (or in_cluster) in site.yaml"
        )
    if status == 404 and kind == "namespaces":
        return (
            f"cannot {action}: namespace {namespace!r} does not exist; check k8s.namespace in "
            "site.yaml or create the namespace"
        )
    if status == 409:
        return (
            f"cannot {action} {where}: it already exists ({message}); was the job launched twice?"
        )
    if status == 422:
        return (
            f"cannot {action} {where}: the API server found it invalid ({message}); check the "
            "study's pod_template and the k8s settings in site.yaml"
        )
    return f"cannot {action} {where}: {status} {getattr(err, 'reason', '')}: {message}"


def make_core_api(site_config: Any) -> Any:
    """A CoreV1Api from site.yaml: in-cluster service account, or a kubeconfig file/context."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    settings = site_config.settings
    try:
        if settings.in_cluster:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.CoreV1Api(client.ApiClient(configuration))
        path = site_config.resolve_path(settings.kubeconfig) if settings.kubeconfig else None
        api_client = config.new_client_from_config(
            config_file=str(path) if path else None, context=settings.context
        )
        return client.CoreV1Api(api_client)
    except (ConfigException, OSError) as err:
        raise LaunchError(
            f"cannot load Kubernetes credentials ({err}); check k8s.kubeconfig, k8s.context "
            "or k8s.in_cluster in site.yaml"
        ) from None


class KubernetesLauncher(Launcher):
    name = "k8s"

    def __init__(self, site_config: Any, api: Any = None, networking: Any = None) -> None:
        self.site_config = site_config
        self.settings = site_config.settings
        self._api = api
        self._networking = networking
        self._lock = threading.Lock()
        self._cancelled: set[str] = set()
        self._progress: dict[str, ProgressCallback] = {}

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = make_core_api(self.site_config)
        return self._api

    @property
    def networking(self) -> Any:
        """The NetworkingV1Api of the same API client (the jobs' NetworkPolicies)."""
        if self._networking is None:
            from kubernetes import client

            self._networking = client.NetworkingV1Api(self.api.api_client)
        return self._networking

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        return render(request)

    # --- launch --------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest, on_progress: ProgressCallback | None = None) -> Handle:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        objects = self.render(request)
        rendered = render_digest(objects)  # before the Secret is given its values below
        pod, secret, policy = objects["pod"], objects["secret"], objects["network_policy"]
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        secret_name, policy_name = secret["metadata"]["name"], policy["metadata"]["name"]
        secret["stringData"] = dict(request.credentials)  # the values exist only in this request
        first = step = "create the job's NetworkPolicy"  # before the Pod: never unconfined
        try:
            self.networking.create_namespaced_network_policy(ns, policy)
            step = "create the job's Secret"
            self.api.create_namespaced_secret(ns, secret)
            step = "create the worker Pod"
            created = self.api.create_namespaced_pod(ns, pod)
            step = "make the Pod own its Secret and NetworkPolicy"
            owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": created.metadata.uid}
            owned = {"metadata": {"ownerReferences": [owner]}}
            self.api.patch_namespaced_secret(secret_name, ns, owned)
            self.networking.patch_namespaced_network_policy(policy_name, ns, owned)
        except (ApiException, HTTPError) as err:
            if step != first:
                self._delete(ns, name, secret_name)
            raise LaunchError(explain_api_error(err, step, ns)) from None
        limit = self.settings.pending_timeout
        asked = request.launcher_spec.get("pending_timeout")
        handle = Handle(
            backend=self.name,
            native_id=name,
            job_id=request.identity.job_id,
            extra={
                "namespace": ns,
                "secret": secret_name,
                "uid": created.metadata.uid,
                "pending_timeout": min(limit, asked) if asked else limit,
                "launched_at": time.time(),
                "workdir": str(request.workdir),
                "image": str(_main_container(pod).get("image", "")),
                RENDER_DIGEST: rendered,  # the Pod, its Secret's name, its NetworkPolicy
            },
        )
        if on_progress is not None:
            self._progress[handle.job_id] = on_progress
            on_progress(f"pod {ns}/{name} created")
        return handle

    def launched_image(self, handle: Handle) -> dict[str, str]:
        """The worker container's image and the ``imageID`` the kubelet reports once the
        container has started (the content digest of the image it ran): the Pod is read until
        then, while it is pending at most (its pending_timeout), or until it is cancelled."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        found = {"image": str(handle.extra.get("image", ""))}
        deadline = handle.extra["launched_at"] + handle.extra["pending_timeout"]
        while not self._was_cancelled(handle) and time.time() < deadline:
            try:
                pod = self.api.read_namespaced_pod(handle.native_id, handle.extra["namespace"])
            except ApiException as err:
                if err.status == 404:
                    break
                pod = None
            except HTTPError:
                pod = None
            if pod is not None and pod.status is not None:
                for container in pod.status.container_statuses or []:
                    if container.name == MAIN_CONTAINER and container.image_id:
                        return {**found, "image_id": str(container.image_id)}
                state = interpret(pod)
                if state.final is not None:
                    break  # ended, or can never start (an image that cannot be pulled): wait says
                if state.note:
                    self._report(handle, state.note)
            time.sleep(IMAGE_POLL_SECONDS)
        return {key: value for key, value in found.items() if value}

    # --- wait ----------------------------------------------------------------------------------
    def wait(self, handle: Handle) -> WorkerExit:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        ns, name = handle.extra["namespace"], handle.native_id
        deadline = handle.extra["launched_at"] + handle.extra["pending_timeout"]
        note, pending, failures = "", True, 0
        while True:
            if self._was_cancelled(handle):
                return self._finish(handle, None)
            try:
                # Each watch starts with the Pod's current state; a Pod gone in between is seen here.
                self.api.read_namespaced_pod(name, ns)
                seconds = WATCH_SECONDS
                if pending:
                    seconds = max(1, min(WATCH_SECONDS, int(deadline - time.time()) + 1))
                stream = watch.Watch().stream(
                    self.api.list_namespaced_pod,
                    ns,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=seconds,
                    _request_timeout=(10, seconds + 30),
                )
                for event in stream:
                    if event["type"] == "DELETED":
                        return self._finish(handle, None)
                    if event["type"] != "ADDED" and event["type"] != "MODIFIED":
                        break  # ERROR (e.g. an expired resourceVersion): reopen the watch
                    state = interpret(event["object"])
                    if state.final is not None:
                        return self._finish(handle, state.final)
                    pending = state.pending
                    if state.note != note:
                        note = state.note
                        self._report(handle, note)
                    if pending and time.time() >= deadline:
                        break
                failures = 0
            except ApiException as err:
                if err.status == 404:
                    return self._finish(handle, None)
                failures += 1
                log.warning("watching pod %s/%s: %s", ns, name, explain_api_error(err, "watch", ns))
            except HTTPError as err:
                failures += 1
                log.warning("watching pod %s/%s: API server unreachable: %s", ns, name, err)
            if pending and time.time() >= deadline:
                timeout = handle.extra["pending_timeout"]
                reason = (
                    f"still not running after {timeout} s (pending_timeout): {note or 'Pending'}"
                )
                return self._finish(handle, WorkerExit(Outcome.FAILED, reason))
            if failures:
                time.sleep(min(30, 2**failures))  # the API server is away: back off, then reconnect

    def _finish(self, handle: Handle, result: WorkerExit | None) -> WorkerExit:
        """Save the worker's log, remove the Pod and its Secret, return the outcome."""
        ns, name = handle.extra["namespace"], handle.native_id
        if self._was_cancelled(handle):
            result = WorkerExit(Outcome.ABORTED, "aborted: the worker pod was deleted by atoll")
        elif result is None:
            result = WorkerExit(
                Outcome.FAILED,
                f"the worker pod {ns}/{name} was deleted outside atoll (kubectl, an eviction "
                "or the namespace's deletion)",
            )
        else:
            self._save_log(handle)
        self._delete(ns, name, handle.extra["secret"])
        self._progress.pop(handle.job_id, None)
        return result

    def _save_log(self, handle: Handle) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        path = Path(handle.extra["workdir"]) / "logs" / "worker.log"
        try:
            response = self.api.read_namespaced_pod_log(
                handle.native_id,
                handle.extra["namespace"],
                container=MAIN_CONTAINER,
                _preload_content=False,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as out:
                for chunk in response.stream(LOG_CHUNK):
                    out.write(chunk)
            response.release_conn()
        except (ApiException, HTTPError, OSError) as err:
            # A worker that never started has no log; that is not a second failure.
            log.info("no log for pod %s: %s", handle.native_id, getattr(err, "reason", err))

    def _report(self, handle: Handle, note: str) -> None:
        callback = self._progress.get(handle.job_id)
        if callback is not None:
            callback(note)

    # --- cancel --------------------------------------------------------------------------------
    def cancel(self, handle: Handle) -> None:
        with self._lock:
            self._cancelled.add(handle.job_id)
        self._delete(
            handle.extra["namespace"], handle.native_id, handle.extra["secret"], strict=True
        )

    def reattach(self, handle: Handle, parent_address: str,
                 parent_socket: str | None) -> bool:
        """A Pod an earlier parent created that is still pending or running: watched from now
        on (``wait``); it dials the parent's endpoint, the same again."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            pod = self.api.read_namespaced_pod(handle.native_id, handle.extra["namespace"])
        except (ApiException, HTTPError, KeyError) as exc:
            log.warning("job %s: pod %s not found again: %s", handle.job_id, handle.native_id,
                        exc)
            return False
        phase = getattr(getattr(pod, "status", None), "phase", None)
        return phase in ("Pending", "Running")

    def remove_leftovers(self, request: LaunchRequest) -> None:
        """The Pod, Secret and NetworkPolicy of ``request``'s names that an earlier parent
        created (it was killed, so it deleted nothing), deleted; returns once the Pod's name is
        free for ``launch``. Whatever that worker still did, its parent and session are gone."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        objects = self.render(request)
        ns, name = objects["pod"]["metadata"]["namespace"], objects["pod"]["metadata"]["name"]
        self._delete(ns, name, objects["secret"]["metadata"]["name"], strict=True)
        deadline = time.monotonic() + LEFTOVER_SECONDS
        while time.monotonic() < deadline:
            try:
                self.api.read_namespaced_pod(name, ns)
            except ApiException as err:
                if err.status == 404:
                    return
                raise LaunchError(explain_api_error(err, "read the earlier worker Pod",
                                                    ns)) from None
            except HTTPError as err:
                raise LaunchError(explain_api_error(err, "read the earlier worker Pod",
                                                    ns)) from None
            time.sleep(IMAGE_POLL_SECONDS)
        raise LaunchError(f"the earlier worker Pod {ns}/{name} was still there "
                          f"{LEFTOVER_SECONDS} s after its deletion; delete it (kubectl delete "
                          "pod --force) and resubmit the job")

    def _was_cancelled(self, handle: Handle) -> bool:
        with self._lock:
            return handle.job_id in self._cancelled

    def _delete(self, ns: str, pod: str, secret: str, strict: bool = False) -> None:
        """Delete the Pod (at once: no grace period), its Secret and its NetworkPolicy; 404
        means already gone."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        calls = (
            ("delete the worker Pod", self.api.delete_namespaced_pod, pod),
            ("delete the job's Secret", self.api.delete_namespaced_secret, secret),
            # after the Pod: the policy confines it until it is gone
            ("delete the job's NetworkPolicy", self.networking.delete_namespaced_network_policy,
             f"{pod}-net"),
        )
        for action, call, name in calls:
            try:
                call(name, ns, grace_period_seconds=0, propagation_policy="Background")
            except (ApiException, HTTPError) as err:
                if getattr(err, "status", None) == 404:
                    continue
                if strict:
                    raise LaunchError(explain_api_error(err, action, ns)) from None
                log.warning("%s", explain_api_error(err, action, ns))

    def close(self) -> None:
        api_client = getattr(self._api, "api_client", None)
        if api_client is not None and hasattr(api_client, "close"):
            api_client.close()


def _main_container(pod: dict[str, Any]) -> dict[str, Any]:
    for container in pod.get("spec", {}).get("containers", []):
        if container.get("name") == MAIN_CONTAINER:
            return dict(container)
    return {}
