"""A site's own settings, ``local/site.yaml``: its one launcher, its capacity, its worker port.

The site's name is not here: it comes from the site's certificate. Relative paths in this file
are relative to the site kit folder (the parent of ``local/``); ``SiteConfig.resolve_path`` does
that. A block for a launcher other than the chosen one is an error: it would be silently unused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, field_validator, model_validator

from atoll.spec.docker_kwargs import docker_kwargs_issues
from atoll.spec.errors import Issue, IssuesError, SpecError, describe
from atoll.spec.model import NoNullModel, check_fields, validate_into
from atoll.spec.names import is_loopback, is_subdomain
from atoll.spec.parent_settings import Links, LogSettings, Restarts, Retention, Supervision
from atoll.spec.quantity import check_memory

SITE_FILE = "site.yaml"
LauncherName = Literal["process", "docker", "k8s", "slurm"]
DEFAULT_PENDING_TIMEOUT = 600


# Loopback addresses inside a worker's sandbox for the destinations site.yaml names by host name
# (its /etc/hosts maps each name to one); a loopback address is dialled as it is.
NAMED_DESTINATIONS_NET = "127.0.100."
MAX_ALLOWED_DESTINATIONS = 200
_HOST_NAME_RE = re.compile(r"(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")


class ProcessNetwork(NoNullModel):
    """``process.network``: what a sandboxed worker's network namespace reaches."""

    mode: Literal["isolated", "host"] = Field(
        "isolated",
        description="isolated: each worker in a network namespace of its own, its parent through "
                    "a unix socket, plus the allowed destinations; host: the host's network "
                    "(every worker reaches every port of the host and of other jobs)")
    allow: list[str] = Field(
        default_factory=list,
        description="Destinations an isolated worker reaches, as host:port (a host name, or a "
                    "loopback address such as 127.0.0.1:5000), relayed by its parent")

    @field_validator("allow")
    @classmethod
    def _destinations(cls, value: list[str]) -> list[str]:
        issues = [Issue(f"[{i}]", why) for i, entry in enumerate(value)
                  if (why := destination_problem(entry))]
        seen: set[str] = set()
        for i, entry in enumerate(value):
            host, _, port = entry.lower().rpartition(":")
            key = f"{'127.0.0.1' if host == 'localhost' else host}:{port}"
            if key in seen:  # the worker would dial both at one address
                issues.append(Issue(f"[{i}]", f"{entry!r} is listed twice"))
            seen.add(key)
        if len(value) > MAX_ALLOWED_DESTINATIONS:
            issues.append(Issue("", f"at most {MAX_ALLOWED_DESTINATIONS} destinations"))
        if issues:
            raise IssuesError(issues)
        return value

    @model_validator(mode="after")
    def _allow_needs_isolation(self) -> ProcessNetwork:
        if self.mode == "host" and self.allow:
            raise IssuesError([Issue("allow", "network mode host reaches every destination "
                                              "already; remove allow, or the mode")])
        return self

    def destinations(self) -> list[tuple[str, int, str]]:
        """(host, port, the address the worker dials it at in its sandbox), in file order."""
        found, named = [], 0
        for entry in self.allow:
            host, _, port = entry.rpartition(":")
            if is_loopback(host):
                listen = "127.0.0.1" if host.lower() == "localhost" else host
            else:
                named += 1
                listen = f"{NAMED_DESTINATIONS_NET}{named}"
            found.append((host, int(port), listen))
        return found


def destination_problem(entry: object) -> str | None:
    """Why ``entry`` is no allowed destination (``host:port``), or None."""
    import ipaddress

    if not isinstance(entry, str):
        return f"must be host:port, not {describe(entry)}"
    host, colon, port = entry.rpartition(":")
    if not colon or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{entry!r} must be host:port with a port from 1 to 65535 (e.g. mlflow.local:5000)"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    if address is not None:
        if address.version == 4 and address.is_loopback:
            return None
        return (f"{entry!r}: name the destination by its host name (the sandbox maps the name to "
                "a loopback address of its own); of addresses only IPv4 loopback (127.x) is taken")
    if not _HOST_NAME_RE.fullmatch(host) or host.replace(".", "").isdigit():
        return f"{entry!r}: {host!r} is not a host name (letters, digits, '-' and '.')"
    return None


def _network_mode(value: Any) -> Any:
    """``network: host`` and ``network: isolated`` are short for ``{mode: ...}``."""
    return {"mode": value} if isinstance(value, str) else value


class ProcessSettings(NoNullModel):
    """``process:`` the worker is a child process of the site parent."""

    python: str | None = Field(
        None, min_length=1, description="Python for workers; default: the parent's own Python"
    )
    workdir: str | None = Field(
        None, min_length=1,
        description="Folder for job run folders, <workdir>/jobs/<job id> (relative: to the kit); "
                    "default: the kit's workspace (spec/run_folders.py)")
    gpu_ids: list[str] = Field(
        default_factory=list, description="GPU ids handed out through CUDA_VISIBLE_DEVICES"
    )
    cpu_ids: list[int] = Field(
        default_factory=list, description="CPUs workers are pinned to; default: the parent's"
    )
    sandbox: Literal["bwrap", "none"] = Field(
        "bwrap",
        description=(
            "bwrap: each worker in its own bubblewrap namespaces (docs/security.md); none: "
            "workers run with the parent's privileges (a loud warning, one study at most)"
        ),
    )
    bwrap: str | None = Field(
        None, min_length=1, description="bwrap binary; default: the bundled one, else PATH's"
    )
    network: ProcessNetwork = Field(
        default_factory=ProcessNetwork,
        description="isolated (default; with allow: [host:port, ...]) or host; sandbox: none "
                    "means host")

    _network_short = field_validator("network", mode="before")(
        lambda cls, value: _network_mode(value))

    @model_validator(mode="after")
    def _network_needs_sandbox(self) -> ProcessSettings:
        if self.sandbox == "none" and "network" in self.model_fields_set and (
                self.network.mode == "isolated"):
            raise IssuesError([Issue("network", (
                "sandbox: none shares the host's network (no namespace to isolate); remove "
                "network, set it to host, or set sandbox: bwrap"))])
        return self

    @property
    def isolated_network(self) -> bool:
        """Whether each worker gets a network namespace of its own."""
        return self.sandbox == "bwrap" and self.network.mode == "isolated"

    @field_validator("gpu_ids", mode="before")
    @classmethod
    def _ids_as_text(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("gpu_ids", "cpu_ids")
    @classmethod
    def _unique_ids(cls, value: list[Any]) -> list[Any]:
        issues = [
            Issue(f"[{i}]", f"{v!r} is listed twice") for i, v in enumerate(value) if v in value[:i]
        ]
        issues += [
            Issue(f"[{i}]", "must not be empty or contain ','")
            for i, v in enumerate(value)
            if isinstance(v, str) and (not v or "," in v)
        ]
        issues += [
            Issue(f"[{i}]", "must be >= 0")
            for i, v in enumerate(value)
            if isinstance(v, int) and v < 0
        ]
        if issues:
            raise IssuesError(issues)
        return value


class DockerSettings(NoNullModel):
    """``docker:`` the worker is a container of a Docker (or Podman) Engine."""

    base_url: str | None = Field(
        None, description="Engine URL, e.g. unix:///var/run/docker.sock; default: DOCKER_HOST"
    )
    network: str | None = Field(
        None,
        min_length=1,
        description="none (the default): no network, the parent through a per-job socket; a "
        "network name: join it (every job on it can reach the others); host: the host's network "
        "(an opt-out of the job's network isolation, docs/security.md)",
    )
    gpu_ids: list[str] = Field(
        default_factory=list,
        description="GPU ids of this host, each given to one container at a time "
        "(device_ids); default: 0..capacity.gpus-1",
    )
    default_image: str | None = Field(
        None, min_length=1, description="Image when the study runtime names none"
    )
    run_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra containers.run keyword arguments for every job"
    )
    allow_job_images: list[str] = Field(
        default_factory=list,
        description="Images a job may choose in launcher_spec (shell patterns, e.g. "
        "registry.example.org/fl/*); empty: jobs may not choose their image",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels on every worker container"
    )
    pull_policy: Literal["missing", "never"] = Field(
        "missing", description="missing: pull an image the engine lacks; never: local images only"
    )

    @field_validator("gpu_ids", mode="before")
    @classmethod
    def _ids_as_text(cls, value: Any) -> Any:
        return ProcessSettings._ids_as_text(value)

    @field_validator("gpu_ids")
    @classmethod
    def _unique_ids(cls, value: list[Any]) -> list[Any]:
        return ProcessSettings._unique_ids(value)

    @property
    def local_engine(self) -> bool:
        """Whether base_url names an engine on this host (a unix socket, or the default)."""
        return self.base_url is None or self.base_url.startswith("unix://")

    @field_validator("labels")
    @classmethod
    def _labels_not_atoll(cls, value: dict[str, str]) -> dict[str, str]:
        owned = ("atoll.job_id", "atoll.job_name", "atoll.site", "atoll.study", "atoll.role")
        issues = [
            Issue(key, f"set by the docker launcher ({', '.join(owned)}); pick another name")
            for key in value
            if key in owned
        ]
        if issues:
            raise IssuesError(issues)
        return value

    @field_validator("run_kwargs")
    @classmethod
    def _run_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        issues = docker_kwargs_issues(value)
        if issues:
            raise IssuesError(issues)
        return value


class K8sSettings(NoNullModel):
    """``k8s:`` the worker is a Pod."""

    kubeconfig: str | None = Field(None, min_length=1, description="Path of a kubeconfig file")
    in_cluster: bool = Field(False, description="Use the Pod's service account (parent in-cluster)")
    context: str | None = Field(None, min_length=1, description="kubeconfig context to use")
    namespace: str = Field("default", description="Namespace of worker Pods and Secrets")
    service_account: str | None = Field(None, description="Service account of worker Pods")
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Secret names for pulling worker images"
    )
    default_image: str | None = Field(
        None, min_length=1, description="Image when the study runtime names none"
    )
    pending_timeout: int = Field(
        DEFAULT_PENDING_TIMEOUT,
        ge=1,
        description="Seconds a Pod may stay Pending; jobs may lower it",
    )
    allow_job_images: list[str] = Field(
        default_factory=list,
        description="Images a job may choose in launcher_spec (shell patterns, e.g. "
        "registry.example.org/fl/*); empty: jobs may not choose their image",
    )
    host_network: bool = Field(
        False,
        description="Run worker Pods in the node's network namespace; for single-node test "
        "clusters without a pod network, where the parent listens on 127.0.0.1",
    )
    python: str = Field("python3", min_length=1, description="The Python inside the worker image")
    parent_pod_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the parent's Pod: the job's NetworkPolicy lets workers reach it "
        "(default: the IP address in worker_endpoint, required then)",
    )
    parent_namespace: str | None = Field(
        None, description="Namespace of the parent's Pod when not the jobs' namespace"
    )

    @field_validator("namespace", "service_account", "parent_namespace")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not is_subdomain(value):
            raise ValueError(f"{value!r} is not a Kubernetes name (lowercase RFC 1123)")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> K8sSettings:
        if self.in_cluster and self.kubeconfig:
            raise ValueError("choose one: kubeconfig or in_cluster: true")
        return self


SLURM_DIRECTIVES = ("partition", "account", "qos", "constraint", "reservation")


def slurm_directive(value: Any) -> Any:
    """A directive as NVIDIA FLARE 2.9 takes it: text or an integer (``account: 1234``), never
    with whitespace (it would split the sbatch option)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and any(c.isspace() for c in value):
        raise ValueError(f"{value!r} contains whitespace; Slurm names have none")
    return value


class SlurmSettings(NoNullModel):
    """``slurm:`` the worker is a Slurm batch job."""

    sbatch: str = Field("sbatch", min_length=1, description="sbatch executable")
    squeue: str = Field("squeue", min_length=1, description="squeue executable")
    sacct: str = Field("sacct", min_length=1, description="sacct executable")
    scancel: str = Field("scancel", min_length=1, description="scancel executable")
    scontrol: str = Field("scontrol", min_length=1, description="scontrol executable")
    workspace: str | None = Field(
        None, min_length=1,
        description="Folder for job run folders, <workspace>/jobs/<job id>, on a file system "
                    "the compute nodes see (relative: to the kit); default: the kit's workspace")
    partition: str | None = Field(None, min_length=1, description="--partition")
    account: str | None = Field(None, min_length=1, description="--account")
    qos: str | None = Field(None, min_length=1, description="--qos")
    time: str | None = Field(None, min_length=1, description="Default --time, e.g. 4:00:00")
    constraint: str | None = Field(None, min_length=1, description="--constraint")
    reservation: str | None = Field(None, min_length=1, description="--reservation")
    sandbox: Literal["none", "apptainer", "pyxis"] = Field(
        "none", description="How the worker runs on the node: bare, Apptainer, or Pyxis"
    )
    container_image: str | None = Field(
        None, min_length=1, description="Image for apptainer/pyxis when the study names none"
    )
    python_path: str = Field(
        "python3", min_length=1, description="Python on the compute nodes (or in the image)"
    )
    pending_timeout: int = Field(
        DEFAULT_PENDING_TIMEOUT,
        ge=1,
        description="Seconds a job may stay PENDING; jobs may lower it",
    )

    @field_validator(*SLURM_DIRECTIVES, mode="before")
    @classmethod
    def _directive(cls, value: Any) -> Any:
        return slurm_directive(value)

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        from atoll.spec.launcher_spec import slurm_time_to_seconds

        slurm_time_to_seconds(value)
        return value


class Capacity(NoNullModel):
    """What this site admits at once, summed over its running jobs."""

    gpus: int | None = Field(None, ge=0, description="GPUs; default: no limit")
    cpus: int | None = Field(None, ge=1, description="CPUs; default: no limit")
    memory: str | None = Field(None, description="Memory, e.g. 512Gi; default: no limit")

    _mem = check_fields(check_memory, "memory")


class WorkerEndpoint(NoNullModel):
    """Where the site parent listens for its own workers.

    Off loopback the endpoint speaks TLS with a certificate the parent makes at start; workers
    get it (public, in ATOLL_PARENT_CERT) and verify the parent with it.
    """

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on")
    port: int = Field(0, ge=0, le=65535, description="0: any free port")
    advertise: str | None = Field(
        None, min_length=1,
        description="Host name or address workers dial, when it differs from host "
                    "(required when host is 0.0.0.0 or ::)")
    tls: Literal["auto", "always"] = Field(
        "auto", description="auto: TLS unless host is loopback; always: TLS on loopback too")

    @model_validator(mode="after")
    def _dialable(self) -> WorkerEndpoint:
        if self.host in ("0.0.0.0", "::") and self.advertise is None:
            raise IssuesError([Issue("advertise", (
                f"host {self.host} listens on every address; set advertise to the name or "
                "address your workers dial (e.g. this node's host name)"))])
        return self

    @property
    def dial_host(self) -> str:
        return self.advertise or self.host

    @property
    def uses_tls(self) -> bool:
        return self.tls == "always" or not is_loopback(self.dial_host)


_SETTINGS = {
    "process": ProcessSettings,
    "docker": DockerSettings,
    "k8s": K8sSettings,
    "slurm": SlurmSettings,
}


class SiteConfig(NoNullModel):
    """The validated ``local/site.yaml``."""

    launcher: LauncherName = Field(description="The site's one launcher")
    process: ProcessSettings | None = Field(None, description="Settings of the process launcher")
    docker: DockerSettings | None = Field(None, description="Settings of the docker launcher")
    k8s: K8sSettings | None = Field(None, description="Settings of the k8s launcher")
    slurm: SlurmSettings | None = Field(None, description="Settings of the slurm launcher")
    capacity: Capacity = Field(default_factory=Capacity, description="Admission limits")
    worker_endpoint: WorkerEndpoint = Field(
        default_factory=WorkerEndpoint, description="Where workers reach this parent"
    )
    logs: LogSettings = Field(default_factory=LogSettings,
                              description="Rotation of the detached parent's log file")
    retention: Retention = Field(default_factory=Retention,
                                 description="How long a site keeps finished run folders")
    supervision: Supervision = Field(default_factory=Supervision,
                                     description="Heartbeats, stalls and rejoins of jobs' parts")
    links: Links = Field(default_factory=Links,
                         description="The server's: its connections to sites and admins")
    restarts: Restarts = Field(default_factory=Restarts,
                               description="The server's: jobs resumed after its restart")
    _kit_dir: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _only_chosen_block(self) -> SiteConfig:
        issues = [
            Issue(
                name,
                f"settings for the {name} launcher, but this site's launcher is "
                f"{self.launcher}: remove this block or set launcher: {name}",
            )
            for name in _SETTINGS
            if name != self.launcher and getattr(self, name) is not None
        ]
        if issues:
            raise IssuesError(issues)
        return self

    @model_validator(mode="after")
    def _docker_network_reaches_parent(self) -> SiteConfig:
        """The docker.network and worker_endpoint combinations whose workers could never
        reach their parent are refused here (``atoll site validate``), not at every launch."""
        docker = self.docker
        if self.launcher != "docker" or docker is None or docker.local_engine:
            return self
        if docker.network in (None, "none"):
            raise IssuesError([Issue("docker.network", (
                f"workers without a network reach their parent through a socket on this host, "
                f"which the engine at {docker.base_url} (another host) cannot mount: set "
                "docker.network to a network whose containers reach worker_endpoint"))])
        if docker.network != "host" and is_loopback(self.worker_endpoint.dial_host):
            raise IssuesError([Issue("worker_endpoint.host", (
                f"the engine at {docker.base_url} runs containers on another host, which cannot "
                f"reach this parent on loopback ({self.worker_endpoint.dial_host}): set "
                f"worker_endpoint.host (or advertise) to an address reachable from the docker "
                f"network {docker.network}"))])
        return self

    @property
    def settings(self) -> Any:
        """The chosen launcher's block (its defaults when the file has none)."""
        return getattr(self, self.launcher) or _SETTINGS[self.launcher]()

    @property
    def kit_dir(self) -> Path | None:
        return self._kit_dir

    def resolve_path(self, value: str | Path) -> Path:
        """A path from this file: absolute as is, relative to the site kit folder otherwise."""
        path = Path(value).expanduser()
        if path.is_absolute() or self._kit_dir is None:
            return path
        return self._kit_dir / path


def parse_site_config(
    data: Any, source: str = SITE_FILE, kit_dir: Path | None = None
) -> SiteConfig:
    """Validate already-parsed YAML; raises SpecError with every problem."""
    if not isinstance(data, dict):
        raise SpecError(
            [Issue("", f"must be a mapping with launcher: ..., not {describe(data)}")],
            source=source,
        )
    config, issues = validate_into(SiteConfig, data)
    if config is None:
        raise SpecError(issues, source=source)
    config._kit_dir = kit_dir
    return config


def load_site_config(path: str | Path) -> SiteConfig:
    """Read ``site.yaml`` (a file, a ``local/`` folder, or a site kit folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / SITE_FILE if (path / SITE_FILE).exists() else path / "local" / SITE_FILE
    data = read_yaml(path)
    return parse_site_config(data, str(path), kit_dir=path.resolve().parent.parent)


def parse_site_yaml(text: bytes, path: Path) -> SiteConfig:
    """``site.yaml``'s bytes, read from ``path`` earlier (a parent keeps the bytes its start
    vouched for, so a later edit of the file cannot slip in unchecked)."""
    try:
        data = yaml.safe_load(text.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecError([Issue("", f"not valid YAML: {err}")], source=str(path)) from None
    return parse_site_config(data, str(path), kit_dir=path.resolve().parent.parent)


def read_yaml(path: Path) -> Any:
    """One YAML document; a read or syntax problem becomes a SpecError naming the file."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError([Issue("", "file not found")], source=str(path)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([Issue("", f"cannot read: {err}")], source=str(path)) from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError([Issue("", f"not valid YAML{at}: {problem}")], source=str(path)) from None
