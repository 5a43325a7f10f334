"""What a study's ``pod_template`` may not set (k8s launcher): checked at load, again at render.

Two kinds of paths are refused, all reported at once, each with its path in the template:

- atoll-owned (``LOCKED``): what the launcher sets from the job and site.yaml, so a second value
  would fight it: names, namespace, ``atoll.dev/`` labels, restartPolicy, hostNetwork (site.yaml
  ``k8s.host_network``), volumes named ``atoll-*``, and on the ``atoll-worker`` container its
  image, command, args, resources, launcher-owned env names and mounts under /data or /atoll;
- host: what would hand the node, the cluster's API or another dataset to the job's code, in the
  pod and in every container (containers, initContainers, ephemeralContainers alike, since they
  share the pod's volumes): hostPID, hostIPC, privileged, allowPrivilegeEscalation: true, added
  capabilities, procMount: Unmasked, unconfined seccomp or AppArmor, sysctls, hostPort, hostPath
  volumes, service-account tokens, a dataset's claim mounted around its mode, GPUs and devices.

``shareProcessNamespace`` stays allowed: it joins the pod's own containers only (the worker and
the site's sidecars), never the node's processes or the site parent, which runs in another pod.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from atoll.spec.errors import Issue, IssuesError, SpecError, describe, join_path
from atoll.spec.site_config import read_yaml
from atoll.spec.worker_env import RESERVED_ENV, RESERVED_ENV_PREFIX

MAIN_CONTAINER = "atoll-worker"
# The worker's container in a template: atoll's name or NVIDIA FLARE's sentinel, else the only
# container of a one-container template (FLARE's fallback); renamed atoll-worker at render.
MAIN_CONTAINER_NAMES = (MAIN_CONTAINER, "nvflare_job")
LABEL_PREFIX = "atoll.dev/"
ATOLL_VOLUME_PREFIX = "atoll-"
OWNED_MOUNT_ROOTS = ("/data", "/atoll")
GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
LOCKED = (
    "metadata.name",
    "metadata.generateName",
    "metadata.namespace",
    "metadata.ownerReferences",
    "metadata.labels[atoll.dev/*]",
    "metadata.annotations[atoll.dev/*]",
    "spec.restartPolicy",
    "spec.hostNetwork",
    "spec.volumes[atoll-*]",
    "spec.containers[atoll-worker].image",
    "spec.containers[atoll-worker].command",
    "spec.containers[atoll-worker].args",
    "spec.containers[atoll-worker].resources",
    "spec.containers[atoll-worker].env[ATOLL_*, PYTHONPATH, ...]",
    "spec.containers[atoll-worker].volumeMounts[mountPath under /data or /atoll]",
)
_OWNED = "set by the launcher; remove it"
_HOST = "not allowed: it would give the job's code control of the node"
_UNCONFINED_SELINUX = ("spc_t", "unconfined_t")
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_SECCOMP_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/pod",
                        "container.seccomp.security.alpha.kubernetes.io/")


def pod_template_issues(
    template: Mapping[str, Any], dataset_claims: Mapping[str, str] | None = None
) -> list[Issue]:
    """Every refused path of ``template`` (paths relative to it, e.g. ``spec.hostPID``).

    ``dataset_claims`` maps each PVC named as a dataset in study_runtime.yaml to where
    (``studies.x.datasets.y``): a template may not mount those around the dataset's mode.
    """
    shape = _shape_issues(template)
    if shape:
        return shape
    return _owned_issues(template) + _host_issues(template, dataset_claims or {})


def dataset_claims(runtime: Mapping[str, Any]) -> dict[str, str]:
    """Each dataset source of a raw study_runtime document (a PVC name on k8s) -> its path."""
    studies = runtime.get("studies")
    claims: dict[str, str] = {}
    for study, entry in (studies if isinstance(studies, dict) else {}).items():
        datasets = entry.get("datasets") if isinstance(entry, dict) else None
        for name, dataset in (datasets if isinstance(datasets, dict) else {}).items():
            source = dataset.get("source") if isinstance(dataset, dict) else None
            if isinstance(source, str):
                claims.setdefault(source, join_path("studies", str(study), "datasets", str(name)))
    return claims


def load_pod_template(
    value: str, local_dir: Path | None, claims: Mapping[str, str] | None = None
) -> Any:
    """A template file under ``local/`` (never outside it, links included), checked here so
    that each refused path also names the template's file."""
    rel = PurePosixPath(value)
    if rel.is_absolute() or ".." in rel.parts or value.startswith("~"):
        raise ValueError(
            f"{value!r} must be a file under local/, written relative to it "
            "(no '..', not absolute), e.g. templates/pod.yaml"
        )
    if local_dir is None:
        raise ValueError("a template file needs the local/ folder; inline the Pod instead")
    path = (local_dir / rel).resolve()
    if not path.is_relative_to(local_dir.resolve()):
        raise ValueError(f"{value!r} leads out of local/ (a symlink?); keep templates under local/")
    try:
        data = read_yaml(path)
    except SpecError as err:
        raise ValueError(f"{value}: {'; '.join(i.message for i in err.issues)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{value} must hold one Pod manifest (a mapping), not {describe(data)}")
    issues = pod_template_issues(data, claims)
    if issues:
        raise IssuesError([Issue(i.path, f"{i.message} (in local/{value})") for i in issues])
    return data


def _items(value: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, item in enumerate(value if isinstance(value, list) else []):
        if isinstance(item, dict):
            yield i, item


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _shape_issues(template: Mapping[str, Any]) -> list[Issue]:
    """The few shapes the checks and the merge rely on; the API server checks the rest."""

    def list_of_maps(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)

    meta, spec = template.get("metadata", {}), template.get("spec", {})
    issues = [Issue(k, "must be a mapping") for k, v in (("metadata", meta), ("spec", spec))
              if not isinstance(v, dict)]
    if issues:
        return issues
    issues += [Issue(f"metadata.{k}", "must be a mapping")
               for k in ("labels", "annotations") if not isinstance(meta.get(k, {}), dict)]
    issues += [Issue(f"spec.{k}", "must be a list of mappings")
               for k in ("volumes", "imagePullSecrets", *CONTAINER_LISTS)
               if not list_of_maps(spec.get(k, []))]
    if not isinstance(spec.get("securityContext", {}), dict):
        issues.append(Issue("spec.securityContext", "must be a mapping"))
    for field in CONTAINER_LISTS:
        for i, container in _items(spec.get(field)):
            issues += [Issue(f"spec.{field}[{i}].{k}", "must be a list of mappings")
                       for k in ("env", "volumeMounts", "ports")
                       if not list_of_maps(container.get(k, []))]
            context = container.get("securityContext", {})
            capabilities = context.get("capabilities", {}) if isinstance(context, dict) else {}
            if not isinstance(context, dict) or not isinstance(capabilities, dict):
                issues.append(Issue(f"spec.{field}[{i}].securityContext",
                                    "must be a mapping (capabilities: a mapping too)"))
            elif not isinstance(capabilities.get("drop", []), list):
                issues.append(Issue(f"spec.{field}[{i}].securityContext.capabilities.drop",
                                    "must be a list"))
    return issues


def _owned_issues(template: Mapping[str, Any]) -> list[Issue]:
    meta, spec = _map(template.get("metadata")), _map(template.get("spec"))
    issues = [Issue(f"metadata.{k}", _OWNED)
              for k in ("name", "generateName", "namespace", "ownerReferences") if k in meta]
    for field in ("labels", "annotations"):
        issues += [
            Issue(join_path(f"metadata.{field}", k), f"{LABEL_PREFIX}* {field} are the "
                  "launcher's; pick another name")
            for k in _map(meta.get(field)) if str(k).startswith(LABEL_PREFIX)
        ]
    if "restartPolicy" in spec:
        issues.append(Issue("spec.restartPolicy", f"{_OWNED} (Never: a worker runs once)"))
    if "hostNetwork" in spec:
        issues.append(Issue("spec.hostNetwork", "set by the launcher from k8s.host_network in "
                            "site.yaml; remove it here"))
    issues += [
        Issue(f"spec.volumes[{i}].name", f"volume names {ATOLL_VOLUME_PREFIX}* are the "
              "launcher's; rename it")
        for i, v in _items(spec.get("volumes"))
        if str(v.get("name", "")).startswith(ATOLL_VOLUME_PREFIX)
    ]
    main = main_container_index(spec.get("containers"))
    for i, container in _items(spec.get("containers")):
        if i == main:
            issues += _main_container_issues(f"spec.containers[{i}]", container)
    return issues


def main_container_index(containers: Any) -> int | None:
    """Which of a template's containers is the worker's (see MAIN_CONTAINER_NAMES), or None."""
    listed = list(_items(containers))
    for i, container in listed:
        if container.get("name") in MAIN_CONTAINER_NAMES:
            return i
    return listed[0][0] if len(listed) == 1 and isinstance(containers, list) else None


def _main_container_issues(at: str, container: dict[str, Any]) -> list[Issue]:
    issues = [Issue(f"{at}.{k}", f"{_OWNED} (the job and the study choose it)")
              for k in ("image", "command", "args", "resources") if k in container]
    for j, env in _items(container.get("env")):
        name = str(env.get("name", ""))
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
            issues.append(Issue(f"{at}.env[{j}].name", f"{name} is {_OWNED}"))
    for j, mount in _items(container.get("volumeMounts")):
        path = str(mount.get("mountPath", "")).rstrip("/")
        if any(path == r or path.startswith(r + "/") for r in OWNED_MOUNT_ROOTS):
            issues.append(Issue(f"{at}.volumeMounts[{j}].mountPath", f"{path} is under "
                                "/data or /atoll, where the launcher mounts datasets and the "
                                "run folder; pick another path"))
    return issues


def _host_issues(template: Mapping[str, Any], claims: Mapping[str, str]) -> list[Issue]:
    meta, spec = _map(template.get("metadata")), _map(template.get("spec"))
    issues = []
    if spec.get("hostPID") is True:
        issues.append(Issue("spec.hostPID", f"{_HOST} (it shares the node's processes, the "
                            "site parent's included); remove it"))
    if spec.get("hostIPC") is True:
        issues.append(Issue("spec.hostIPC", f"{_HOST} (it shares the node's IPC namespace); "
                            "remove it"))
    if spec.get("automountServiceAccountToken") is True:
        issues.append(Issue("spec.automountServiceAccountToken", "not allowed: it hands the "
                            "job a Kubernetes API token (workers talk only to their parent); "
                            "remove it"))
    if spec.get("resourceClaims"):
        issues.append(Issue("spec.resourceClaims", "not allowed: devices come from the job's "
                            "resource_spec (num_of_gpus); remove it"))
    issues += _annotation_issues(_map(meta.get("annotations")))
    issues += _context_issues("spec.securityContext", _map(spec.get("securityContext")))
    for i, volume in _items(spec.get("volumes")):
        issues += _volume_issues(f"spec.volumes[{i}]", volume, claims)
    main_index = main_container_index(spec.get("containers"))
    for field in CONTAINER_LISTS:
        for i, container in _items(spec.get(field)):
            main = field == "containers" and i == main_index
            issues += _container_issues(f"spec.{field}[{i}]", container, main)
    return issues


def _annotation_issues(annotations: dict[str, Any]) -> list[Issue]:
    issues = []
    for key, value in annotations.items():
        key = str(key)
        confining = key.startswith(_APPARMOR_ANNOTATION) or key.startswith(_SECCOMP_ANNOTATIONS)
        if confining and str(value).strip() == "unconfined":
            issues.append(Issue(join_path("metadata.annotations", key), f"{_HOST} (it turns "
                                "off the kernel's confinement of the job); remove it"))
    return issues


def _context_issues(at: str, context: dict[str, Any]) -> list[Issue]:
    """What pod and container securityContexts share."""
    issues = []
    for field in ("seccompProfile", "appArmorProfile"):
        if _map(context.get(field)).get("type") == "Unconfined":
            issues.append(Issue(f"{at}.{field}.type", f"{_HOST} (Unconfined turns off the "
                                "kernel's confinement); use RuntimeDefault or Localhost"))
    if _map(context.get("seLinuxOptions")).get("type") in _UNCONFINED_SELINUX:
        issues.append(Issue(f"{at}.seLinuxOptions.type", f"{_HOST} (an unconfined SELinux "
                            "type); remove it"))
    if _map(context.get("windowsOptions")).get("hostProcess") is True:
        issues.append(Issue(f"{at}.windowsOptions.hostProcess", f"{_HOST}; remove it"))
    if context.get("sysctls"):
        issues.append(Issue(f"{at}.sysctls", f"{_HOST} (it changes kernel settings); set them "
                            "on the node instead"))
    return issues


def _volume_issues(at: str, volume: dict[str, Any], claims: Mapping[str, str]) -> list[Issue]:
    issues = []
    if "hostPath" in volume:
        issues.append(Issue(f"{at}.hostPath", f"{_HOST} (a folder of the node); give the data "
                            "to the study as a dataset: a PVC named in studies.<study>.datasets"))
    claim = _map(volume.get("persistentVolumeClaim")).get("claimName")
    if isinstance(claim, str) and claim in claims:
        issues.append(Issue(f"{at}.persistentVolumeClaim.claimName", f"{claim!r} is the "
                            f"dataset {claims[claim]}: a dataset reaches a pod only through "
                            "datasets (at /data/<study>/<name>, with its mode); remove it"))
    for k, source in _items(_map(volume.get("projected")).get("sources")):
        if "serviceAccountToken" in source:
            issues.append(Issue(f"{at}.projected.sources[{k}].serviceAccountToken", "not "
                                "allowed: it hands the job a Kubernetes API token (workers "
                                "talk only to their parent); remove it"))
    return issues


def _container_issues(at: str, container: dict[str, Any], main: bool) -> list[Issue]:
    context = _map(container.get("securityContext"))
    sc = f"{at}.securityContext"
    issues = _context_issues(sc, context)
    if context.get("privileged") is True:
        issues.append(Issue(f"{sc}.privileged", f"{_HOST} (a privileged container controls "
                            "it); remove it"))
    if context.get("allowPrivilegeEscalation") is True:
        issues.append(Issue(f"{sc}.allowPrivilegeEscalation", f"{_HOST} (setuid programs and "
                            "file capabilities would work); remove it"))
    if _map(context.get("capabilities")).get("add"):
        issues.append(Issue(f"{sc}.capabilities.add", f"{_HOST} (capabilities give powers "
                            "over it; the launcher drops them all on atoll-worker); remove it"))
    if context.get("procMount") == "Unmasked":
        issues.append(Issue(f"{sc}.procMount", f"{_HOST} (Unmasked exposes the node's /proc "
                            "and /sys paths); remove it"))
    issues += [
        Issue(f"{at}.ports[{j}].hostPort", f"{_HOST} (it opens a port of the node; the worker "
              "needs none, it dials its parent); remove it")
        for j, port in _items(container.get("ports")) if port.get("hostPort")
    ]
    resources = _map(container.get("resources"))
    if not main:  # the worker's resources are the launcher's (an owned path)
        asks = {**_map(resources.get("requests")), **_map(resources.get("limits"))}
        if any(str(k) == GPU_RESOURCE or str(k).endswith("/gpu") for k in asks):
            issues.append(Issue(f"{at}.resources", "not allowed: GPUs come from the job's "
                                "resource_spec num_of_gpus, for the worker only; remove them"))
        if resources.get("claims"):
            issues.append(Issue(f"{at}.resources.claims", "not allowed: devices come from the "
                                "job's resource_spec; remove it"))
    return issues
