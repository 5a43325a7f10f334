"""What the process launcher keeps of site.yaml's ``process:`` block, as plain values.

spec/site_config.py's ProcessSettings validates the block (pydantic). The launcher keeps a few
values of it, read once when it is made: these. The check of ``local/`` (parent/local_config.py)
sends them with its answer and its record keeps them, so that a parent makes its process
launcher, and launches its first worker, without loading the models; a launcher made from a
SiteConfig derives the same values from it (``of``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcessOptions:
    python: str | None = None  # the workers' Python (None: the parent's own)
    gpu_ids: tuple[str, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    sandboxed: bool = True  # sandbox: bwrap
    bwrap: str | None = None
    isolated: bool = True  # a network namespace of its own per worker
    allow: tuple[str, ...] = ()  # network.allow, when isolated
    # network.destinations(), when isolated: (host, port, the address dialled in the sandbox)
    destinations: tuple[tuple[str, int, str], ...] = ()

    @classmethod
    def of(cls, settings: Any) -> ProcessOptions:
        """From a validated ProcessSettings."""
        isolated = bool(settings.isolated_network)
        return cls(python=settings.python, gpu_ids=tuple(settings.gpu_ids),
                   cpu_ids=tuple(settings.cpu_ids), sandboxed=settings.sandbox == "bwrap",
                   bwrap=settings.bwrap, isolated=isolated,
                   allow=tuple(settings.network.allow) if isolated else (),
                   destinations=(tuple(tuple(d) for d in settings.network.destinations())
                                 if isolated else ()))

    def values(self) -> dict[str, Any]:
        """The JSON document a record keeps."""
        return asdict(self)

    @classmethod
    def from_values(cls, doc: Any) -> ProcessOptions | None:
        """The options a record kept; None when the document is not of their shape (the
        parent then checks site.yaml again)."""
        try:
            options = cls(
                python=doc["python"], gpu_ids=tuple(doc["gpu_ids"]),
                cpu_ids=tuple(doc["cpu_ids"]), sandboxed=doc["sandboxed"], bwrap=doc["bwrap"],
                isolated=doc["isolated"], allow=tuple(doc["allow"]),
                destinations=tuple((d[0], d[1], d[2]) for d in doc["destinations"]
                                   if len(d) == 3))
            ok = (set(doc) == set(asdict(options))
                  and all(v is None or (isinstance(v, str) and v)
                          for v in (options.python, options.bwrap))
                  and all(isinstance(g, str) for g in options.gpu_ids)
                  and all(type(c) is int and c >= 0 for c in options.cpu_ids)
                  and all(type(b) is bool for b in (options.sandboxed, options.isolated))
                  and all(isinstance(a, str) for a in options.allow)
                  and len(options.destinations) == len(doc["destinations"])
                  and all(isinstance(h, str) and type(p) is int and isinstance(a, str)
                          for h, p, a in options.destinations))
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return options if ok else None


@dataclass(frozen=True)
class ProcessSite:
    """What a process launch reads of site.yaml where the parent keeps no SiteConfig
    (parent/local_config.py ``launch_site``): the kit, which no lent folder may show
    (lent_folders.py), and the capacity a job is checked against (launchers/request.py)."""

    kit_dir: Path | None
    capacity: dict[str, Any] = field(default_factory=dict)  # gpus, cpus, memory as checked
    launcher: str = "process"
