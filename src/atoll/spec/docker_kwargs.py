"""Which Docker ``containers.run`` keyword arguments a site operator may add, and which not.

Used for ``docker.run_kwargs`` in site.yaml and ``docker_kwargs`` in study_runtime.yaml. Four
kinds of keys are refused, each with what to write instead:

- launcher-owned: atoll sets them from the job and the site's other settings (image, command,
  environment, mounts, resources, names, labels, network...), so a second value would fight it;
- host-control: they would hand the job's code (which comes from the federation) part of the
  host, whatever their value: privileged, cap_add, devices, pid_mode, sysctls, ports, ...;
- host values: allowed keys with a value that reaches the host (``ipc_mode: host``,
  ``cgroupns: host``, a negative ``oom_score_adj``, a ``tmpfs`` over the launcher's mounts);
- unknown: not a ``containers.run`` argument of the Docker SDK 7 (a typo).

The site operator writes both files, but job code comes from the federation: these rules keep
even a well-meant setting from handing the host to it. ``docs/deploy-docker.md`` lists them.
"""

from __future__ import annotations

from typing import Any

from atoll.spec.errors import Issue, describe, join_path

# docker.models.containers RUN_CREATE_KWARGS + RUN_HOST_CONFIG_KWARGS (docker 7.x) + run() own.
_RUN_KWARGS = frozenset(
    """
    command detach domainname entrypoint environment healthcheck hostname image labels mac_address
    name network_disabled platform stdin_open stop_signal tty use_config_proxy user working_dir
    auto_remove blkio_weight_device blkio_weight cap_add cap_drop cgroup_parent cgroupns cpu_count
    cpu_percent cpu_period cpu_quota cpu_shares cpuset_cpus cpuset_mems cpu_rt_period
    cpu_rt_runtime device_cgroup_rules device_read_bps device_read_iops device_write_bps
    device_write_iops devices device_requests dns_opt dns_search dns extra_hosts group_add init
    init_path ipc_mode isolation kernel_memory links log_config lxc_conf mem_limit
    mem_reservation mem_swappiness memswap_limit mounts nano_cpus network_mode oom_kill_disable
    oom_score_adj pid_mode pids_limit privileged publish_all_ports read_only restart_policy
    security_opt shm_size storage_opt sysctls tmpfs ulimits userns_mode uts_mode version
    volume_driver volumes_from runtime network networking_config ports volumes remove stdout
    stderr stream
    """.split()
)

_HOST_FOLDERS = "host folders reach a job only as the study's datasets or secret_mounts"
_GPUS = "GPUs come from the job's resource_spec num_of_gpus"
_WHY_OWNED = {
    "image": "the image comes from the study's container.image (or docker.default_image)",
    "command": "the launcher runs the atoll worker",
    "entrypoint": "the launcher runs the atoll worker",
    "environment": "use env (values) or secret_env (references) of the study",
    "volumes": _HOST_FOLDERS,
    "mounts": _HOST_FOLDERS,
    "device_requests": _GPUS,
    "nano_cpus": "CPUs come from the job's resource_spec num_of_cpus",
    "cpu_quota": "CPUs come from the job's resource_spec num_of_cpus",
    "cpu_period": "CPUs come from the job's resource_spec num_of_cpus",
    "cpu_count": "CPUs come from the job's resource_spec num_of_cpus",
    "cpu_percent": "CPUs come from the job's resource_spec num_of_cpus",
    "mem_limit": "memory comes from the job's resource_spec memory",
    "memswap_limit": "memory comes from the job's resource_spec memory",
    "labels": "atoll labels every worker container itself",
    "name": "atoll names every worker container itself",
    "detach": "the launcher decides how it waits for the worker",
    "remove": "the launcher removes the container after reading its exit",
    "auto_remove": "the launcher removes the container after reading its exit",
    "stdout": "the launcher collects the worker's logs",
    "stderr": "the launcher collects the worker's logs",
    "stream": "the launcher collects the worker's logs",
    "network": "set docker.network in site.yaml",
    "network_mode": "set docker.network in site.yaml (host: the host's network, for every job)",
    "networking_config": "set docker.network in site.yaml",
    "working_dir": "the launcher sets the worker's run folder",
}
LAUNCHER_OWNED = frozenset(_WHY_OWNED)

# Refused whatever the value: each one hands the job part of this host (or of another job).
_WHY_HOST = {
    "privileged": "a privileged container controls the host",
    "cap_add": "capabilities give the job powers over the host; the launcher drops them all",
    "security_opt": (
        "the launcher sets no-new-privileges and keeps the engine's default seccomp and AppArmor "
        "profiles, which an entry here could only loosen (unconfined, label=disable, a custom "
        "profile); set a stricter default on the engine instead (dockerd --seccomp-profile)"
    ),
    "devices": f"host devices are never given to jobs; {_GPUS}",
    "device_cgroup_rules": f"host devices are never given to jobs; {_GPUS}",
    "pid_mode": "it shares the process IDs of the host or of another container",
    "userns_mode": "userns_mode: host turns off the engine's user-namespace remapping",
    "uts_mode": "it shares the host's name, which the job could then change",
    "cgroup_parent": "it moves the container to another cgroup, around the engine's limits",
    "sysctls": "it changes kernel settings (on the host network: the host's own)",
    "volumes_from": "it mounts another container's volumes (another job's data)",
    "links": "it connects the job to another container (another job)",
    "ports": "it publishes a port of the host; the worker needs none, it dials its parent",
    "publish_all_ports": "it publishes ports of the host; the worker needs none",
    "init_path": "it runs a program of the host as the container's init",
}
HOST_CONTROL = frozenset(_WHY_HOST)
# Not containers.run arguments, but what people coming from the CLI or compose write.
_UNKNOWN_HINTS = {"binds": _HOST_FOLDERS, "gpus": _GPUS}
# Where the launcher mounts the run folder and datasets: a tmpfs there would hide them.
_LAUNCHER_MOUNT_ROOTS = ("/atoll", "/data")


def docker_kwargs_issues(kwargs: dict[str, Any]) -> list[Issue]:
    """Every refused key of a run-kwargs mapping; paths are the key names."""
    issues: list[Issue] = []
    for key in kwargs:
        if key in LAUNCHER_OWNED:
            issues.append(Issue(key, f"set by the docker launcher; remove it: {_WHY_OWNED[key]}"))
        elif key in HOST_CONTROL:
            issues.append(
                Issue(
                    key,
                    "not allowed: it would give the job's code control of this host "
                    f"({_WHY_HOST[key]}); remove it",
                )
            )
        elif key not in _RUN_KWARGS:
            hint = f"; {_UNKNOWN_HINTS[key]}" if key in _UNKNOWN_HINTS else ""
            issues.append(
                Issue(
                    key,
                    "not a Docker containers.run argument; check the spelling "
                    f"(https://docker-py.readthedocs.io/en/stable/containers.html){hint}",
                )
            )
        elif kwargs[key] is None:
            issues.append(Issue(key, "null is not allowed; remove the key"))
        else:
            issues += _value_issues(key, kwargs[key])
    return issues


def _value_issues(key: str, value: Any) -> list[Issue]:
    """Keys that are fine with most values, refused with the few that reach the host."""
    host = "not allowed: it would give the job's code control of this host"
    if key == "ipc_mode" and isinstance(value, str):
        if value == "host" or value.startswith("container:"):
            return [
                Issue(
                    key,
                    f"{host} ({describe(value)} shares the IPC namespace of the host or of "
                    "another container); use private, shareable or none",
                )
            ]
    elif key == "cgroupns" and value == "host":
        return [Issue(key, f"{host} (the host's cgroup namespace); use private or remove it")]
    elif key == "oom_kill_disable" and value is True:
        return [
            Issue(key, f"{host} (a job over its memory would stall the host); remove it")
        ]
    elif key == "oom_score_adj" and isinstance(value, int) and value < 0:
        return [
            Issue(
                key,
                f"{host} (below 0 the kernel kills the host's own processes before the job); "
                "use 0 or more",
            )
        ]
    elif key == "tmpfs":
        return _tmpfs_issues(value)
    return []


def _tmpfs_issues(value: Any) -> list[Issue]:
    if not isinstance(value, dict):
        return [Issue("tmpfs", "must be a mapping of container path -> mount options")]
    issues = []
    for target in value:
        path = join_path("tmpfs", str(target))
        text = str(target).rstrip("/")
        if not str(target).startswith("/"):
            issues.append(Issue(path, "must be an absolute path inside the container"))
        elif any(text == root or text.startswith(root + "/") for root in _LAUNCHER_MOUNT_ROOTS):
            issues.append(
                Issue(
                    path,
                    "the launcher mounts the job's run folder and datasets under /atoll and "
                    "/data; a tmpfs there would hide them: pick another path",
                )
            )
    return issues
