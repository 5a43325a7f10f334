"""A parent's own housekeeping in ``local/site.yaml`` (docs/operations.md): the rotation of
its log file when it runs detached, and how long a site keeps finished jobs' run folders."""

from __future__ import annotations

from pydantic import Field, field_validator

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


class Retention(NoNullModel):
    """``retention``: what a site parent removes by itself."""

    run_folders_days: float | None = Field(
        None, gt=0, description="Remove the run folders of jobs finished more than this many "
                                "days ago; default: keep them")
