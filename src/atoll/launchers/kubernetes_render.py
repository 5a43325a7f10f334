"""The Kubernetes launcher's pure half: a LaunchRequest becomes a Pod and its credentials Secret.

The Pod starts from the study's ``pod_template`` when the site gives one (node selectors,
tolerations, affinity, security contexts, sidecars stay the site's), then atoll's fields are
applied on top. A template may not set what atoll owns (``LOCKED``) nor hand the node to the job
(``atoll.spec.pod_template``, checked when study_runtime.yaml is loaded and again here): every
such path is reported at once. The worker's container is the template's container named
``atoll-worker`` (created when the template has none); it always runs unprivileged, without
capabilities or privilege escalation, under the runtime's default seccomp profile, with no
service-account token, and with ``NVIDIA_VISIBLE_DEVICES=void`` when the job asks no GPU. A job
of several processes runs them all in this one pod (launchers/ranks.py); never several pods.

The Secret carries the credential *names* only: values are ``<set at launch>`` placeholders here,
filled by ``KubernetesLauncher.launch``. The worker reads them through ``secretKeyRef``.

Every job has its own NetworkPolicy (``render_network_policy``), created before its Pod: the
job's Pods take connections only from the job's own Pods, and open them only to those and to
their parent's worker port (the parent's Pod by ``k8s.parent_pod_labels``, else the IP address
in worker_endpoint; DNS too when the parent is dialled by name). Enforced by a CNI that
implements NetworkPolicy; Pods on the host network (``k8s.host_network``) are never subject to it.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

from atoll.launchers.base import JobIdentity, LaunchError, LaunchRequest, check_ids
from atoll.launchers.images import choose_image
from atoll.launchers.ranks import container_rank_env
from atoll.spec import worker_env
from atoll.spec.errors import Issue
from atoll.spec.names import address_host, is_loopback
from atoll.spec.pod_template import (  # noqa: F401  (LOCKED: re-exported, the documented list)
    ATOLL_VOLUME_PREFIX,
    GPU_RESOURCE,
    LABEL_PREFIX,
    LOCKED,
    MAIN_CONTAINER,
    main_container_index,
    pod_template_issues,
)
from atoll.spec.study_runtime import data_root
from atoll.spec.study_runtime import dataset_mount_path as dataset_path
from atoll.spec.worker_env import RESULTS_HOME_VAR, SEND_RESULTS

PLACEHOLDER = "<set at launch>"
WORKDIR = "/atoll/job"  # an emptyDir: the parent's run folder is not shared with the pod
NO_GPU = "void"  # NVIDIA_VISIBLE_DEVICES: no GPU even where an image asks for all of them
_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9-]+")
_INVALID_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


# --- names -------------------------------------------------------------------------------------
def _name_part(text: str, limit: int) -> str:
    """Lowercase RFC 1123 characters only, at most ``limit`` long, no leading/trailing '-'."""
    part = _INVALID_NAME_CHARS.sub("-", text.lower()).strip("-")
    return part[:limit].rstrip("-") or "x"


def pod_name(site: str, job_id: str) -> str:
    """``atoll-<site>-<job id[:12]>``: a valid RFC 1123 label (at most 63 characters).

    >>> pod_name("Hospital_A.east", "0123456789abcdef0123456789abcdef")
    'atoll-hospital-a-east-0123456789ab'
    """
    # 63 - "atoll-" - "-" - 12 hex - "-creds" (so the Secret's name is a label too) = 38
    check_ids(job_id, site)  # checked ids only
    return f"atoll-{_name_part(site, 38)}-{_name_part(job_id, 12)}"


def secret_name(site: str, job_id: str) -> str:
    return f"{pod_name(site, job_id)}-creds"


def network_policy_name(site: str, job_id: str) -> str:
    return f"{pod_name(site, job_id)}-net"


def label_value(text: str) -> str:
    """A valid label value (63 characters, alphanumerics at both ends), or '' when nothing is left."""
    value = _INVALID_LABEL_CHARS.sub("-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def job_labels(identity: JobIdentity) -> dict[str, str]:
    """Labels that name the job on every object it creates (select with ``atoll.dev/job-id``)."""
    return {
        "app.kubernetes.io/managed-by": "atoll",
        "app.kubernetes.io/component": f"{identity.role}-worker",
        f"{LABEL_PREFIX}job-id": identity.job_id,
        f"{LABEL_PREFIX}site": label_value(identity.site),
        f"{LABEL_PREFIX}study": label_value(identity.study),
        f"{LABEL_PREFIX}role": identity.role,
    }


def _volume_name(kind: str, name: str) -> str:
    """``atoll-<kind>-<name>``; names too long for a label keep a short hash to stay unique."""
    full = f"{ATOLL_VOLUME_PREFIX}{kind}-{name}"
    if len(full) <= 63:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{full[:54].rstrip('-')}-{digest}"


# --- values ------------------------------------------------------------------------------------
def resource_requirements(request: LaunchRequest) -> dict[str, dict[str, str]]:
    """The worker's ``resources``: ``requests`` and ``limits``, as NVIDIA FLARE 2.9 renders them.

    Portable ``num_of_cpus``/``memory`` set both. Native ``cpu``/``memory`` are limits (and the
    requests unless ``cpu_request``/``memory_request`` say less); a request alone sets no limit.
    Nothing asked: neither (the namespace's defaults apply). GPUs and ephemeral storage: both.
    """
    spec, res = request.launcher_spec, request.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    portable = {"cpu": res.num_of_cpus, "memory": res.memory}
    for key in ("cpu", "memory"):
        if portable[key] is not None:
            requests[key] = limits[key] = str(portable[key])
            continue
        limit, request_value = spec.get(key), spec.get(f"{key}_request", spec.get(key))
        if limit is not None:
            limits[key] = str(limit)
        if request_value is not None:
            requests[key] = str(request_value)
    if spec.get("ephemeral_storage"):
        requests["ephemeral-storage"] = limits["ephemeral-storage"] = spec["ephemeral_storage"]
    if res.num_of_gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(res.num_of_gpus)
    return {"requests": requests, "limits": limits}


def image_for(request: LaunchRequest) -> str:
    """The shared container precedence (``atoll.launchers.images``) with this site's settings."""
    settings = request.site_config.settings
    return choose_image(
        launcher="k8s",
        study=request.identity.study,
        job_image=request.launcher_spec.get("image"),
        study_runtime=request.study_runtime,
        default_image=settings.default_image,
        allowed_job_images=settings.allow_job_images,
    ).image


# --- template checks ---------------------------------------------------------------------------
def _template(request: LaunchRequest) -> dict[str, Any]:
    """The study's template, checked again (spec/pod_template.py) however the request was made."""
    study, name = request.study_runtime, request.identity.study
    template = copy.deepcopy(study.pod_template) if study and study.pod_template else {}
    datasets = study.datasets if study else {}
    claims = {ds.source: f"studies.{name}.datasets.{n}" for n, ds in datasets.items()}
    issues = pod_template_issues(template, claims)
    spec = template.get("spec")
    if request.site_config.settings.service_account and isinstance(spec, dict):
        issues += [Issue(f"spec.{k}", "set by the launcher from k8s.service_account in "
                         "site.yaml; remove it here")
                   for k in ("serviceAccountName", "serviceAccount") if k in spec]
    where = f"studies.{name}.pod_template"
    if issues:
        raise LaunchError(
            f"local/study_runtime.yaml: {where} may not set these (the launcher, the job and "
            "site.yaml own some; others would hand the node to the job): "
            + "; ".join(f"{where}.{i.path}: {i.message}" for i in issues)
        )
    containers = (template.get("spec") or {}).get("containers")
    if containers:
        main = main_container_index(containers)
        if main is None:
            raise LaunchError(
                f"local/study_runtime.yaml: {where}.spec.containers has several containers and "
                f"none named {MAIN_CONTAINER!r} (or NVIDIA FLARE's 'nvflare_job'); name the "
                "worker's container so the study's env and secrets cannot land on a sidecar"
            )
        containers[main]["name"] = MAIN_CONTAINER
    return template


def _confine(pod_spec: dict[str, Any], main: dict[str, Any]) -> None:
    """No privileges for the job: whatever the template adds, the worker keeps none of them."""
    pod_spec["automountServiceAccountToken"] = False  # the worker never calls the API
    context = pod_spec.setdefault("securityContext", {})
    context.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    worker = main.setdefault("securityContext", {})
    drop = list((worker.get("capabilities") or {}).get("drop") or [])
    worker.update(
        privileged=False,
        allowPrivilegeEscalation=False,
        capabilities={"drop": ["ALL", *(c for c in drop if c != "ALL")]},
    )


# --- the objects -------------------------------------------------------------------------------
def _env(request: LaunchRequest, secret: str) -> list[dict[str, Any]]:
    """Study env, secret env (references), atoll's env, then credentials from the job's Secret."""
    ident = request.identity
    study = request.study_runtime
    env: list[dict[str, Any]] = []
    if study is not None:
        env += [{"name": k, "value": v} for k, v in study.env.items()]
        env += [
            {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.source, "key": ref.key}}}
            for k, ref in study.secret_env.items()
        ]
    atoll_env = dict(request.worker_env)
    atoll_env.update(
        ATOLL_JOB_ID=ident.job_id,
        ATOLL_ROLE=ident.role,
        ATOLL_SITE=ident.site,
        ATOLL_STUDY=ident.study,
        ATOLL_PARENT=request.parent_address,
        ATOLL_WORKDIR=WORKDIR,
        ATOLL_DATA_ROOT=data_root(ident.study),
    )
    # The emptyDir goes with the Pod: its results/ travel to the parent (wire/results_archive.py)
    atoll_env[RESULTS_HOME_VAR] = SEND_RESULTS
    atoll_env.pop(worker_env.PARENT_PID, None)  # the parent's PID means nothing in another pod
    if not request.resources.num_of_gpus:
        atoll_env["NVIDIA_VISIBLE_DEVICES"] = NO_GPU
    atoll_env.update(container_rank_env(request))  # several ranks: all in this one pod
    env += [{"name": k, "value": v} for k, v in sorted(atoll_env.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}}
        for k in sorted(request.credentials)
    ]
    return env


def _volumes(request: LaunchRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    study = request.study_runtime
    volumes: list[dict[str, Any]] = [{"name": f"{ATOLL_VOLUME_PREFIX}work", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": f"{ATOLL_VOLUME_PREFIX}work", "mountPath": WORKDIR}]
    if study is None:
        return volumes, mounts
    for name, ds in study.datasets.items():
        vol, read_only = _volume_name("data", name), ds.mode == "ro"
        claim = {"claimName": ds.source, "readOnly": read_only}
        volumes.append({"name": vol, "persistentVolumeClaim": claim})
        path = dataset_path(request.identity.study, name)
        mounts.append({"name": vol, "mountPath": path, "readOnly": read_only})
    for name, sm in study.secret_mounts.items():
        vol = _volume_name("secret", name)
        secret: dict[str, Any] = {"secretName": sm.source}
        if sm.items:  # only these keys, at these file names (NVIDIA FLARE's items)
            secret["items"] = [{"key": k, "path": p} for k, p in sm.items.items()]
        volumes.append({"name": vol, "secret": secret})
        mounts.append({"name": vol, "mountPath": sm.mount_path, "readOnly": True})
    return volumes, mounts


def render_secret(request: LaunchRequest) -> dict[str, Any]:
    """The per-job Secret with the credential names; values are placeholders."""
    ident = request.identity
    settings = request.site_config.settings
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(ident.site, ident.job_id),
            "namespace": settings.namespace,
            "labels": job_labels(ident),
        },
        "type": "Opaque",
        "stringData": {k: PLACEHOLDER for k in sorted(request.credentials)},
    }


def render_pod(request: LaunchRequest) -> dict[str, Any]:
    ident = request.identity
    settings = request.site_config.settings
    host_network = settings.host_network
    if is_loopback(address_host(request.parent_address)) and not host_network:
        raise LaunchError(
            f"the site parent listens on {request.parent_address}, which a pod cannot reach: "
            "set worker_endpoint.host in site.yaml to an address pods reach (e.g. the parent "
            "pod's IP or Service), or k8s.host_network: true on a single-node test cluster"
        )
    pod = _template(request)
    meta = pod.setdefault("metadata", {})
    labels = {**(meta.get("labels") or {}), **job_labels(ident)}
    meta.update(
        name=pod_name(ident.site, ident.job_id), namespace=settings.namespace, labels=labels
    )
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        f"{LABEL_PREFIX}job-name": ident.job_name,
    }
    pod.update(apiVersion="v1", kind="Pod")
    spec = pod.setdefault("spec", {})
    spec["restartPolicy"] = "Never"
    spec.setdefault("enableServiceLinks", False)
    if host_network:
        spec["hostNetwork"] = True
        spec.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    pull = list(spec.get("imagePullSecrets") or [])
    pull += [{"name": s} for s in settings.image_pull_secrets if {"name": s} not in pull]
    if pull:
        spec["imagePullSecrets"] = pull
    volumes, mounts = _volumes(request)
    spec["volumes"] = list(spec.get("volumes") or []) + volumes
    containers = spec.setdefault("containers", [])
    main = next((c for c in containers if c.get("name") == MAIN_CONTAINER), None)
    if main is None:
        main = {"name": MAIN_CONTAINER}
        containers.insert(0, main)
    python = settings.python
    main.update(
        image=image_for(request),
        command=[python, *request.worker_args],
        resources=resource_requirements(request),
        env=list(main.get("env") or []) + _env(request, secret_name(ident.site, ident.job_id)),
        volumeMounts=list(main.get("volumeMounts") or []) + mounts,
    )
    main.setdefault("workingDir", WORKDIR)
    _confine(spec, main)
    return pod


def _job_selector(identity: JobIdentity) -> dict[str, Any]:
    """This job's Pods, and only them (the labels atoll sets; a template cannot change them)."""
    labels = job_labels(identity)
    keys = (f"{LABEL_PREFIX}job-id", f"{LABEL_PREFIX}site", f"{LABEL_PREFIX}role")
    return {"matchLabels": {k: labels[k] for k in keys}}


def _parent_peer(request: LaunchRequest) -> tuple[dict[str, Any], bool]:
    """The NetworkPolicy peer of the parent, and whether workers must resolve its name."""
    import ipaddress

    settings, host = request.site_config.settings, address_host(request.parent_address)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if settings.parent_pod_labels:
        peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(settings.parent_pod_labels)}}
        if settings.parent_namespace and settings.parent_namespace != settings.namespace:
            peer["namespaceSelector"] = {
                "matchLabels": {"kubernetes.io/metadata.name": settings.parent_namespace}}
        return peer, address is None
    if address is None:
        raise LaunchError(
            f"the job's NetworkPolicy cannot name the parent {request.parent_address} (a host "
            "name): set k8s.parent_pod_labels in site.yaml to the labels of the parent's Pod, "
            "or worker_endpoint.advertise to its IP address"
        )
    return {"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}, False


def render_network_policy(request: LaunchRequest) -> dict[str, Any]:
    """The job's NetworkPolicy: its Pods reach each other and their parent's port, nothing else;
    only its own Pods reach them."""
    ident, settings = request.identity, request.site_config.settings
    own = {"podSelector": _job_selector(ident)}
    parent, by_name = _parent_peer(request)
    port = int(request.parent_address.rsplit(":", 1)[1])
    egress: list[dict[str, Any]] = [
        {"to": [own]},
        {"to": [parent], "ports": [{"protocol": "TCP", "port": port}]},
    ]
    if by_name:  # the cluster's DNS, to resolve the parent's name (port 53 only)
        dns = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
        egress.append({"to": [dns], "ports": [{"protocol": "UDP", "port": 53},
                                              {"protocol": "TCP", "port": 53}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(ident.site, ident.job_id),
            "namespace": settings.namespace,
            "labels": job_labels(ident),
        },
        "spec": {
            "podSelector": _job_selector(ident),
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [own]}],
            "egress": egress,
        },
    }


def render(request: LaunchRequest) -> dict[str, Any]:
    """``{"pod": <Pod>, "secret": <Secret, placeholder values>, "network_policy": <its policy>}``.

    The Secret and the policy carry the Pod's labels (the template's included), so all select
    together.
    """
    pod, secret = render_pod(request), render_secret(request)
    policy = render_network_policy(request)
    secret["metadata"]["labels"] = dict(pod["metadata"]["labels"])
    policy["metadata"]["labels"] = dict(pod["metadata"]["labels"])
    return {"pod": pod, "secret": secret, "network_policy": policy}
