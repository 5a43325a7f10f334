"""Admission: whether a job may run in a study and at a site, in one place.

Three questions, each answered here alone and asked by every hop that needs it:

- the study's rules (``study_issues``): the sites a job names are enrolled in its study, and
  its ``mandatory_clients`` and ``min_clients`` can ever be met there (``atoll job validate``
  on the user's machine, and the server's intake);
- what a job asks at a site (``asked_at``): its ``resource_spec`` read for the launcher that site
  runs (the scheduler, the site's admission, the launch request);
- whether that fits (``fits``: next to what the site's running jobs hold, the scheduler and the
  site's admission; ``capacity_issues``: within the site's whole capacity, the launch request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from atoll.spec.errors import Issue
from atoll.spec.names import ALL_SITES, SERVER
from atoll.spec.quantity import memory_to_bytes

if TYPE_CHECKING:  # spec.meta imports pydantic; parents import this at rest
    from atoll.spec.meta_plain import Meta
    from atoll.spec.resources import Resources


# --- the study's rules ----------------------------------------------------------------------------


def study_issues(meta: Meta, study: str | None, study_sites: Sequence[str]) -> list[Issue]:
    """What makes a job wait forever in ``study`` (None: a simulation's sites): a site of
    ``deploy_map`` or ``mandatory_clients`` that is not enrolled, more ``min_clients`` than the
    sites it can reach. Each issue's path is the meta.json field it names."""
    issues = []
    where = f"study {study!r}" if study else "the simulation"
    enrolled = ", ".join(study_sites) or "none"
    for app, targets in meta.deploy_map.items():
        for i, target in enumerate(targets):
            if target not in (SERVER, ALL_SITES) and target not in study_sites:
                issues.append(Issue(f"deploy_map.{app}[{i}]", f"site {target!r} is not enrolled "
                                    f"in {where} (its sites: {enrolled})"))
    for i, site in enumerate(meta.mandatory_clients):
        if site not in study_sites:
            issues.append(Issue(f"mandatory_clients[{i}]", f"site {site!r} is not enrolled in "
                                f"{where} (its sites: {enrolled}); the job could never start"))
    reachable = reachable_sites(meta, study_sites)
    if meta.min_clients is not None and meta.min_clients > len(reachable):
        issues.append(Issue("min_clients", (
            f"{meta.min_clients}, but the job can reach only {len(reachable)} site(s) of {where} "
            f"({', '.join(reachable) or 'none'}); it could never start: write at most "
            f"{len(reachable)}, or add sites")))
    return issues


def reachable_sites(meta: Meta, study_sites: Sequence[str]) -> list[str]:
    """The sites the job deploys to that are enrolled in the study: the only ones it is ever
    dispatched to, even when a site was removed from the study after the job was submitted."""
    return [t for t in meta.expand_targets(list(study_sites)) if t in study_sites]


# --- what a job asks at a site --------------------------------------------------------------------


def asked_at(meta: Meta, site: str, launcher: str) -> Resources:
    """What the job asks at ``site``: its resource_spec for that site, with the block of
    launcher_spec for the ``launcher`` the site runs. SpecError when it asks nonsense."""
    from atoll.spec.resources import resolve_resources

    if not meta.launcher_spec:  # no launcher_spec models to load (pydantic) for nothing
        return resolve_resources(meta.resource_spec, site, None)
    from atoll.spec.launcher_spec import merged_block

    return resolve_resources(meta.resource_spec, site,
                             merged_block(meta.launcher_spec, site, launcher))


# --- whether it fits ------------------------------------------------------------------------------


class Shortage(NamedTuple):
    """One resource the job asks more of than is free: its field, what is asked and what is
    free (counts, or bytes for memory)."""

    field: str  # "num_of_gpus", "num_of_cpus" or "memory"
    asked: int
    free: int


def shortages(capacity: Mapping[str, Any], used: Sequence[Resources],
              asked: Resources) -> list[Shortage]:
    """What ``asked`` lacks next to ``used`` within ``capacity`` (gpus, cpus, memory: None or
    missing is no limit)."""
    short = []
    gpus = capacity.get("gpus")
    if gpus is not None:
        free = gpus - sum(r.num_of_gpus for r in used)
        if asked.num_of_gpus > free:
            short.append(Shortage("num_of_gpus", asked.num_of_gpus, free))
    cpus = capacity.get("cpus")
    if cpus is not None:
        free = cpus - sum(r.cpus_counted for r in used)
        if asked.cpus_counted > free:
            short.append(Shortage("num_of_cpus", asked.cpus_counted, free))
    memory = capacity.get("memory")
    if memory is not None and asked.memory is not None and asked.memory_counted is not None:
        free = memory_to_bytes(memory) - sum(r.memory_counted or 0 for r in used)
        if asked.memory_counted > free:
            short.append(Shortage("memory", asked.memory_counted, free))
    return short


def fits(capacity: Mapping[str, Any], used: Sequence[Resources], asked: Resources) -> str | None:
    """None if ``asked`` fits next to ``used`` in ``capacity``; else what is short, first."""
    for short in shortages(capacity, used, asked):
        if short.field == "num_of_gpus":
            return f"{short.asked} GPU(s) asked, {short.free} free"
        if short.field == "num_of_cpus":
            return f"{short.asked} CPU(s) asked, {short.free} free"
        return f"{asked.memory} memory asked{_on_nodes(asked)}, {short.free >> 20}Mi free"
    return None


def capacity_issues(asked: Resources, capacity: Mapping[str, Any]) -> list[Issue]:
    """What a job asks beyond the site's whole capacity (local/site.yaml): it could never run
    there, whatever else runs."""
    issues = []
    for short in shortages(capacity, [], asked):
        if short.field == "num_of_gpus":
            issues.append(Issue("resource_spec.num_of_gpus", (
                f"asks {short.asked} GPU(s); this site has {capacity['gpus']} "
                "(capacity.gpus in local/site.yaml)")))
        elif short.field == "num_of_cpus":
            issues.append(Issue("resource_spec.num_of_cpus",
                                f"asks {short.asked} CPU(s); this site has {capacity['cpus']}"))
        else:
            issues.append(Issue("resource_spec.memory", (
                f"asks {asked.memory}{_on_nodes(asked)}; this site has {capacity['memory']}")))
    return issues


def _on_nodes(asked: Resources) -> str:
    return f" on each of {asked.nodes} nodes" if asked.nodes > 1 else ""
