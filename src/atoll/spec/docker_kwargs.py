"""Which Docker ``containers.run`` keyword arguments a site operator may add, and which not.

Used for ``docker.run_kwargs`` in site.yaml and ``docker_kwargs`` in study_runtime.yaml. Three
kinds of keys are refused, each with what to write instead:

- launcher-owned: atoll sets them from the job and the site's other settings (image, command,
  environment, mounts, resources, names, labels, network...), so a second value would fight it;
- host-control: they would hand the job's code (which comes from the federation) control of the
  host: privileged, cap_add, pid_mode, userns_mode, security_opt, ...;
- unknown: not a ``containers.run`` argument of the Docker SDK 7 (a typo).
"""

from __future__ import annotations

from typing import Any

from atoll.spec.errors import Issue

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

_WHY_OWNED = {
    "image": "the image comes from the study's container.image (or docker.default_image)",
    "command": "the launcher runs the atoll worker",
    "entrypoint": "the launcher runs the atoll worker",
    "environment": "use env (values) or secret_env (references) of the study",
    "volumes": "use the study's datasets or secret_mounts",
    "mounts": "use the study's datasets or secret_mounts",
    "device_requests": "GPUs come from the job's resource_spec num_of_gpus",
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
    "network_mode": "set docker.network in site.yaml",
    "networking_config": "set docker.network in site.yaml",
    "working_dir": "the launcher sets the worker's run folder",
}
LAUNCHER_OWNED = frozenset(_WHY_OWNED)
HOST_CONTROL = frozenset(
    {
        "privileged",
        "cap_add",
        "pid_mode",
        "userns_mode",
        "security_opt",
        "device_cgroup_rules",
        "volumes_from",
        "uts_mode",
        "cgroupns",
        "cgroup_parent",
    }
)


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
                    ("not allowed: it would give the job's code control of this host; remove it"),
                )
            )
        elif key not in _RUN_KWARGS:
            issues.append(
                Issue(
                    key,
                    (
                        "not a Docker containers.run argument; check the spelling "
                        "(https://docker-py.readthedocs.io/en/stable/containers.html)"
                    ),
                )
            )
        elif kwargs[key] is None:
            issues.append(Issue(key, "null is not allowed; remove the key"))
    return issues
