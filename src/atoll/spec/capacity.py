"""Admission: does a job's request fit next to what a site's running jobs already hold?"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atoll.spec.quantity import memory_to_bytes

if TYPE_CHECKING:  # spec.resources imports pydantic; parents import this module at rest
    from atoll.spec.resources import Resources


def fits(capacity: dict[str, Any], used: list[Resources], asked: Resources) -> str | None:
    """None if `asked` fits next to `used` in `capacity`; else what is short."""
    gpus = capacity.get("gpus")
    if gpus is not None and sum(r.num_of_gpus for r in used) + asked.num_of_gpus > gpus:
        return f"{asked.num_of_gpus} GPU(s) asked, {gpus - sum(r.num_of_gpus for r in used)} free"
    cpus = capacity.get("cpus")
    if cpus is not None and sum(r.cpus_counted for r in used) + asked.cpus_counted > cpus:
        return f"{asked.cpus_counted} CPU(s) asked, {cpus - sum(r.cpus_counted for r in used)} free"
    memory = capacity.get("memory")
    if memory is not None and asked.memory is not None:
        total = memory_to_bytes(memory)
        held = sum(r.memory_counted or 0 for r in used)
        if held + (asked.memory_counted or 0) > total:
            nodes = f" on each of {asked.nodes} nodes" if asked.nodes > 1 else ""
            return f"{asked.memory} memory asked{nodes}, {(total - held) >> 20}Mi free"
    return None
