"""What container confinement refuses, as data: shared by the load-time tests (spec) and the
render-time tests (launchers), so both layers are held to one list."""

from __future__ import annotations

from typing import Any

# docker_kwargs / run_kwargs: (kwargs, the refused path under the kwargs mapping).
DOCKER_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"privileged": True}, "privileged"),
    ({"privileged": False}, "privileged"),  # the launcher's own: even false is not for a file
    ({"cap_add": ["SYS_ADMIN"]}, "cap_add"),
    ({"security_opt": ["seccomp=unconfined"]}, "security_opt"),
    ({"security_opt": ["apparmor=unconfined"]}, "security_opt"),
    ({"security_opt": ["label=disable"]}, "security_opt"),
    ({"devices": ["/dev/nvidia0:/dev/nvidia0:rwm"]}, "devices"),
    ({"device_requests": [{"count": -1, "capabilities": [["gpu"]]}]}, "device_requests"),
    ({"device_cgroup_rules": ["c 195:* rmw"]}, "device_cgroup_rules"),
    ({"ipc_mode": "host"}, "ipc_mode"),
    ({"ipc_mode": "container:atoll-site-1-other-job"}, "ipc_mode"),
    ({"pid_mode": "host"}, "pid_mode"),
    ({"cgroupns": "host"}, "cgroupns"),
    ({"cgroup_parent": "/"}, "cgroup_parent"),
    ({"sysctls": {"net.ipv4.ip_forward": "1"}}, "sysctls"),
    ({"userns_mode": "host"}, "userns_mode"),
    ({"uts_mode": "host"}, "uts_mode"),
    ({"network_mode": "host"}, "network_mode"),
    ({"volumes": {"/": {"bind": "/host", "mode": "ro"}}}, "volumes"),
    ({"mounts": [{"Type": "bind", "Source": "/", "Target": "/host"}]}, "mounts"),
    ({"binds": ["/:/host"]}, "binds"),
    ({"volumes_from": ["atoll-site-1-other-job"]}, "volumes_from"),
    ({"links": {"atoll-site-1-other-job": "other"}}, "links"),
    ({"ports": {"8080/tcp": 8080}}, "ports"),
    ({"publish_all_ports": True}, "publish_all_ports"),
    ({"init_path": "/usr/bin/evil-init"}, "init_path"),
    ({"oom_kill_disable": True}, "oom_kill_disable"),
    ({"oom_score_adj": -1000}, "oom_score_adj"),
    ({"tmpfs": {"/data/imaging": "size=1m"}}, "tmpfs./data/imaging"),
    ({"tmpfs": {"/atoll/job": ""}}, "tmpfs./atoll/job"),
]
DOCKER_ALLOWED: dict[str, Any] = {
    "ipc_mode": "private",
    "cgroupns": "private",
    "oom_score_adj": 100,
    "oom_kill_disable": False,
    "tmpfs": {"/scratch": "size=64m"},
    "cap_drop": ["NET_RAW"],
    "group_add": ["1001"],
    "shm_size": "1g",
    "read_only": True,
    "pids_limit": 256,
}


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "sidecar", "image": "registry.example.org/shipper:1", **fields}


def _in_every_list(fields: dict[str, Any], tail: str) -> list[tuple[dict[str, Any], str]]:
    """The same container setting in containers, initContainers and ephemeralContainers."""
    return [
        ({"spec": {kind: [container(**fields)]}}, f"spec.{kind}[0].{tail}")
        for kind in ("containers", "initContainers", "ephemeralContainers")
    ]


# pod_template: (a fragment merged into a Pod template, the refused path under pod_template).
POD_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"spec": {"hostPID": True}}, "spec.hostPID"),
    ({"spec": {"hostIPC": True}}, "spec.hostIPC"),
    ({"spec": {"hostNetwork": True}}, "spec.hostNetwork"),  # site.yaml k8s.host_network only
    ({"spec": {"hostNetwork": False}}, "spec.hostNetwork"),
    ({"spec": {"automountServiceAccountToken": True}}, "spec.automountServiceAccountToken"),
    ({"spec": {"resourceClaims": [{"name": "gpu"}]}}, "spec.resourceClaims"),
    (
        {"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}},
        "spec.securityContext.seccompProfile.type",
    ),
    (
        {"spec": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}},
        "spec.securityContext.appArmorProfile.type",
    ),
    (
        {"spec": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}},
        "spec.securityContext.seLinuxOptions.type",
    ),
    (
        {"spec": {"securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "0"}]}}},
        "spec.securityContext.sysctls",
    ),
    (
        {"spec": {"securityContext": {"windowsOptions": {"hostProcess": True}}}},
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    (
        {"metadata": {"annotations": {
            "container.apparmor.security.beta.kubernetes.io/atoll-worker": "unconfined"}}},
        "metadata.annotations.container.apparmor.security.beta.kubernetes.io/atoll-worker",
    ),
    (
        {"metadata": {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}},
        "metadata.annotations.seccomp.security.alpha.kubernetes.io/pod",
    ),
    (
        {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
        "spec.volumes[0].hostPath",
    ),
    (
        {"spec": {"volumes": [{"name": "sock", "hostPath": {"path": "/var/run/docker.sock"}}]}},
        "spec.volumes[0].hostPath",
    ),
    (
        {"spec": {"volumes": [{"name": "tok", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}]}}]}},
        "spec.volumes[0].projected.sources[0].serviceAccountToken",
    ),
    (  # another study's dataset (and any dataset around its mode)
        {"spec": {"volumes": [{"name": "b", "persistentVolumeClaim": {"claimName": "beta-pvc"}}]}},
        "spec.volumes[0].persistentVolumeClaim.claimName",
    ),
    *_in_every_list({"securityContext": {"privileged": True}}, "securityContext.privileged"),
    *_in_every_list(
        {"securityContext": {"allowPrivilegeEscalation": True}},
        "securityContext.allowPrivilegeEscalation",
    ),
    *_in_every_list(
        {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
        "securityContext.capabilities.add",
    ),
    *_in_every_list({"securityContext": {"procMount": "Unmasked"}}, "securityContext.procMount"),
    *_in_every_list(
        {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "securityContext.seccompProfile.type",
    ),
    *_in_every_list({"ports": [{"containerPort": 80, "hostPort": 80}]}, "ports[0].hostPort"),
    *_in_every_list({"resources": {"limits": {"nvidia.com/gpu": "1"}}}, "resources"),
    (
        {"spec": {"containers": [{"name": "atoll-worker",
                                  "securityContext": {"privileged": True}}]}},
        "spec.containers[0].securityContext.privileged",
    ),
]
POD_ALLOWED: dict[str, Any] = {
    "kind": "Pod",
    "spec": {
        "shareProcessNamespace": True,  # the pod's own containers only: documented as allowed
        "hostPID": False,
        "hostIPC": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "Localhost",
                                                                     "localhostProfile": "p.json"}},
        "volumes": [
            {"name": "scratch", "emptyDir": {}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": "not-a-dataset"}},
        ],
        "containers": [
            {
                "name": "atoll-worker",
                "securityContext": {
                    "privileged": False,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["NET_RAW"]},
                    "readOnlyRootFilesystem": True,
                },
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "ports": [{"containerPort": 8080}],
            },
            container(resources={"limits": {"cpu": "100m", "memory": "64Mi"}}),
        ],
    },
}


def pod_with(fragment: dict[str, Any]) -> dict[str, Any]:
    """A Pod template made of ``fragment`` (kind: Pod added)."""
    return {"kind": "Pod", **fragment}
