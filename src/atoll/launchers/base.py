"""The launcher contract: how a parent turns a job's resolved requests into one worker.

Every backend is a small translation with two halves:

- ``render(request)`` is pure: it returns the native object the backend would create (Docker
  ``containers.run`` kwargs, a Kubernetes Pod manifest, an ``sbatch`` argv and script, a process
  argv and environment). It never touches the backend and never contains a secret value.
- ``launch / wait / cancel`` do the I/O through one injected client.

The site parent's supervisor calls ``launch`` once per job, then ``wait`` in a thread of its own;
``wait`` returns when the worker has ended, whatever the cause. ``cancel`` is idempotent.

Each ``launch`` keeps the digest of what it rendered for the job (``render_digest``, in its
handle's ``extra``): the site's provenance entry names it, so an auditor can tell which exact
container, Pod, batch script or process the site ran. A render holds no secret value, so
neither does its digest.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.spec.names import IdentifierError, check_job_id, check_site_name, check_study_name

if TYPE_CHECKING:  # the spec models import pydantic, which parents load only for a job
    from atoll.spec.resources import Resources


class LaunchError(AtollError):
    """The backend refused to create the worker; the message says what to change and where."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class JobIdentity:
    job_id: str  # 32 lowercase hex characters, unique per job
    job_name: str  # the job's meta.json name (free text, rendered only into labels/comments safely)
    study: str
    site: str  # the participant this worker runs for: a site name, or "server"
    role: Literal["server", "site"]


def check_identity(identity: JobIdentity) -> JobIdentity:
    """The ids a render puts into names, paths and scripts are of their grammars
    (spec/names.py): a job id, site and study from a peer never become a second path component
    or a shell word. LaunchError names the one that is not."""
    check_ids(identity.job_id, identity.site)
    try:
        check_study_name(identity.study, "the study")
    except IdentifierError as exc:
        raise LaunchError(f"the worker is not launched: {exc}") from None
    return identity


def check_ids(job_id: str, site: str) -> None:
    """The job id and participant that name a worker's container, pod, cgroup or Slurm job."""
    try:
        check_job_id(job_id, "the job id")
        check_site_name(site, "the participant")
    except IdentifierError as exc:
        raise LaunchError(f"the worker is not launched: {exc}") from None


@dataclass(frozen=True)
class LaunchRequest:
    identity: JobIdentity
    resources: Resources
    # This backend's job-settable block, already merged (default then site) and validated.
    launcher_spec: Mapping[str, Any]
    # The study's entry of local/study_runtime.yaml at this site (None: the study maps nothing).
    study_runtime: Any  # atoll.spec.study_runtime.StudyEntry | None
    site_config: Any  # atoll.spec.site_config.SiteConfig
    # The job's run folder on the parent's host: app files are under it, logs go into it.
    workdir: Path
    # Where the worker dials its parent (host:port); the worker needs nothing else to find it.
    parent_address: str
    # Non-secret environment for the worker (ATOLL_JOB_ID, ATOLL_ROLE, ...), set by the parent.
    worker_env: Mapping[str, str] = field(default_factory=dict)
    # Secret credentials for the worker (the one-time job token). Never rendered, never in argv:
    # each backend passes them by its own secret channel at launch time.
    credentials: Mapping[str, str] = field(default_factory=dict)
    # Folders outside workdir the parent shares with the worker by path (the server's handoff
    # folder): a sandboxed worker sees them read-write at the same path, and nothing else.
    shared_folders: tuple[Path, ...] = ()
    # The parent's unix socket for its workers (a path on the parent's host, None: it has none):
    # a worker in a network namespace of its own dials ``unix:<this>``, bound into its sandbox.
    parent_socket: str | None = None
    # What the worker's Python runs: `-m atoll.worker` in production. Tests of a launcher alone
    # may pass e.g. ("-c", "...") to run a tiny program under the same rendering rules.
    worker_args: tuple[str, ...] = ("-m", "atoll.worker")


RENDER_DIGEST = "render_digest"  # the key of a launched handle's ``extra`` that holds it


def render_digest(rendered: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a render (canonical JSON: sorted keys, no spaces; a path or other
    value JSON lacks as its text): the same render, the same digest."""
    import hashlib
    import json

    text = json.dumps(rendered, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class Outcome(enum.Enum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class WorkerExit:
    outcome: Outcome
    reason: str  # one sentence a person can act on, e.g. "out of memory (limit 64Gi)"
    exit_code: int | None = None


@dataclass
class Handle:
    """What a launcher needs to find its worker again; JSON-serializable fields only."""

    backend: str
    native_id: str  # pid, container id, pod name, Slurm job id
    job_id: str
    extra: dict[str, Any] = field(default_factory=dict)


# Called by a launcher when the worker moves between backend-visible phases before it reports
# itself (e.g. Slurm PENDING -> RUNNING). The text is shown as the site's reason.
ProgressCallback = Callable[[str], None]


class Launcher(ABC):
    name: ClassVar[str]
    # Its workers run on the parent's host and see the parent's folders at the same paths:
    # the server parent then hands replies to its worker as files (wire/handoff.py).
    shares_host: ClassVar[bool] = False

    @abstractmethod
    def render(self, request: LaunchRequest) -> dict[str, Any]:
        """Pure: the native object(s) this backend would create, with backend field names."""

    @abstractmethod
    def launch(self, request: LaunchRequest, on_progress: ProgressCallback | None = None) -> Handle:
        """Create the worker. Raises LaunchError with a clear message on refusal."""

    @abstractmethod
    def wait(self, handle: Handle) -> WorkerExit:
        """Block until the worker has ended; map the backend's final state to an Outcome."""

    @abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Stop and remove the worker. Idempotent: a worker already gone counts as cancelled."""

    def launched_image(self, handle: Handle) -> dict[str, str]:
        """The image the worker runs and its content digest as the engine reports it, for the
        site's provenance entry: ``image`` and ``image_id`` (the engine's) or ``image_digest``
        (one the site computed); {} where the worker runs no image. Called once, after
        launch(); never raises (a digest it cannot learn is left out)."""
        return {}

    def reattach(self, handle: Handle, parent_address: str,
                 parent_socket: str | None) -> bool:
        """Take back the worker an earlier parent of this site launched (``handle``), if it
        still runs: ``wait`` and ``cancel`` then work on it as on one launched here, and it
        reaches this parent (``parent_address``, ``parent_socket``) again. False: it is gone,
        or this launcher's workers do not outlive their parent (the default)."""
        return False

    def remove_leftovers(self, request: LaunchRequest) -> None:  # noqa: B027 - optional hook
        """Before ``request``'s worker starts again under the same job and role (the server
        worker of a job resumed after a server restart): remove what an earlier parent's worker
        of it left that would stand in the way (a Pod and its objects, of the same names). By
        default nothing: the worker died with its parent, or leaves nothing of a fixed name."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and background threads."""
