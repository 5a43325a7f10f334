"""A parent's own housekeeping in ``local/site.yaml`` (docs/operations.md): the rotation of
its log file when it runs detached, how long a site keeps finished jobs' run folders, and how
long a part may go without a sign of life (``supervision``)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from atoll.spec.model import NoNullModel
from atoll.spec.quantity import check_memory, memory_to_bytes


class LogSettings(NoNullModel):
    """``logs``: the detached parent's ``workspace/<role>.log``, rotated by size."""

    max_size: str = Field("64Mi", description="Rotate the log when it passes this size (Mi, Gi)")
    keep: int = Field(5, ge=1, le=100, description="Old log files kept: <role>.log.1 ... .N")

    _size = field_validator("max_size")(classmethod(lambda cls, value: check_memory(value)))

    @property
    def max_bytes(self) -> int:
        return memory_to_bytes(self.max_size)


class Restarts(NoNullModel):
    """``restarts``: the server parent's resumption of running jobs after its own restart."""

    max_resumes: int = Field(3, ge=0, le=1000, description=(
        "How many times one job is resumed from its checkpoint after a server restart; the "
        "next restart fails it, saying so. 0: a restart fails every running job"))


class Links(NoNullModel):
    """``links``: the server parent's connections to its sites and admins."""

    tls_record_bytes: int = Field(16384, ge=1024, le=16384, description=(
        "Server: the largest TLS record it sends, in bytes (1024-16384; TLS's and gRPC's "
        "16384 by default). Each connection keeps a buffer of this size: at 4096, 10,000 "
        "connected sites hold about 80 MiB less of the server's memory, and a large model "
        "costs the server more CPU to send (more, smaller records). For federations of "
        "thousands of sites with small models"))


class Retention(NoNullModel):
    """``retention``: what a site parent removes by itself."""

    run_folders_days: float | None = Field(
        None, gt=0, description="Remove the run folders of jobs finished more than this many "
                                "days ago; default: keep them")


class Supervision(NoNullModel):
    """``supervision``: how long a job's part may go without a sign of life (docs/federation.md,
    Restarts and stalls). A site reads ``heartbeat_s``, ``stall_s`` and ``progress_s``; the
    server ``rejoin_s`` (a site too: how long its workers wait for a restarted parent)."""

    heartbeat_s: float = Field(10.0, gt=0, le=3600,
                               description="How often a site's worker tells its parent it lives")
    stall_s: float = Field(120.0, gt=0, description=(
        "A site's worker that sent no heartbeat for this long is stopped and its part "
        "restarted once for the round in flight, then failed, with the reason"))
    progress_s: float = Field(21600.0, gt=0, description=(
        "A site's worker that holds a task and shows no progress for this long (no call to the "
        "client API, no bytes of the task or its reply moving, no progress report such as "
        "fl.log_metrics) is stopped, its part restarted once for the round in flight, then "
        "failed, with the reason; it bounds a script that hangs while its heartbeat goes on"))
    rejoin_s: float = Field(300.0, ge=0, description=(
        "Server: how long a site's parts wait for a site parent that disconnected to come back "
        "before they fail (0: at once). Site: how long a container, pod or Slurm worker waits "
        "for its restarted parent to take it back (0: the next parent stops it)"))

    @model_validator(mode="after")
    def _beats_within_stall(self) -> Supervision:
        if self.heartbeat_s >= self.stall_s:
            raise ValueError(f"supervision.heartbeat_s ({self.heartbeat_s:g}) must be below "
                             f"stall_s ({self.stall_s:g}): a live worker would count as stalled")
        return self
