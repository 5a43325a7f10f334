"""What the site parent keeps about each worker it launched, in its own state folder: the
launcher's handle (launchers/base.py: JSON only), written atomically at launch and removed when
the part ends. A parent that died (`kill -9`, an OOM kill, a reboot) leaves these behind; the
next one stops what they name before it takes a dispatch (a container, pod or Slurm job of the
old parent would otherwise hold the job's name, or its GPU). A process worker died with its
parent already (PR_SET_PDEATHSIG), and its pid may now be another process's: it is only
forgotten."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.base.files import PRIVATE, private_dir, write_atomic
from atoll.launchers.base import Handle
from atoll.spec.names import IdentifierError, check_job_id

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher

log = logging.getLogger("atoll.site.running_parts")

FOLDER = Path("state") / "parts"


@dataclass(frozen=True)
class Rejoin:
    """What a successor needs to take a worker back (see the top)."""

    token: str
    address: str  # the worker endpoint the worker dials ("" through a relay socket)
    study: str
    resources: dict[str, Any]
    signed: dict[str, Any] | None = None

    @staticmethod
    def of(doc: Any) -> Rejoin | None:
        if not isinstance(doc, dict):
            return None
        try:
            token, address, study = (str(doc[k]) for k in ("token", "address", "study"))
            resources = dict(doc["resources"])
        except (KeyError, TypeError, ValueError):
            return None
        signed = doc.get("signed")
        return Rejoin(token, address, study, resources,
                      signed if isinstance(signed, dict) else None) if token else None


class RunningParts:
    def __init__(self, workspace: Path):
        self.folder = workspace / FOLDER

    def launched(self, handle: Handle, rejoin: Rejoin | None = None) -> None:
        try:  # the job runs on without it; a crash would then leave its worker unnamed
            body = {"backend": handle.backend, "native_id": handle.native_id,
                    "job_id": handle.job_id, "extra": handle.extra,
                    "rejoin": vars(rejoin) if rejoin is not None else None}
            write_atomic(private_dir(self.folder) / f"{handle.job_id}.json",
                         json.dumps(body, default=str), PRIVATE)
        except (OSError, AttributeError, TypeError, ValueError) as exc:
            log.warning("a worker's handle was not kept: %s", exc)

    def ended(self, job_id: str) -> None:
        (self.folder / f"{job_id}.json").unlink(missing_ok=True)

    def left_behind(self) -> list[Handle]:
        """The handles an earlier parent kept and never removed."""
        return [handle for handle, _ in self.kept()]

    def kept(self) -> list[tuple[Handle, Rejoin | None]]:
        """The handles an earlier parent kept, each with what taking its worker back needs
        (None: it was launched without re-attach)."""
        found: list[tuple[Handle, Rejoin | None]] = []
        if not self.folder.is_dir():
            return found
        for path in sorted(self.folder.glob("*.json")):
            try:
                doc = json.loads(path.read_text())
                handle = Handle(str(doc["backend"]), str(doc["native_id"]),
                                check_job_id(doc["job_id"]), dict(doc.get("extra") or {}))
                if path.stem != handle.job_id:  # one file per job, named for it
                    raise ValueError(f"it names job {handle.job_id}")
                found.append((handle, Rejoin.of(doc.get("rejoin"))))
            except (OSError, ValueError, KeyError, TypeError, IdentifierError) as exc:
                log.warning("ignored %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
        return found

    def stop_left_behind(self, launcher: Launcher) -> list[str]:
        """Stop each worker an earlier parent left (not a process worker: see above); the ids
        of their jobs. A dispatch of one of them then starts its part afresh."""
        return self.stop(launcher, self.left_behind())

    def stop(self, launcher: Launcher, handles: list[Handle]) -> list[str]:
        """Stop (or forget) the workers of ``handles``, as ``stop_left_behind``."""
        stopped = []
        for handle in handles:
            if handle.backend == launcher.name and handle.backend != "process":
                try:
                    launcher.cancel(handle)
                    stopped.append(handle.job_id)
                    log.warning("job %s: stopped the worker an earlier site parent left (%s)",
                                handle.job_id, handle.native_id)
                except Exception as exc:  # noqa: BLE001 - the next launch says what is wrong
                    log.warning("job %s: the worker an earlier site parent left was not "
                                "stopped: %s", handle.job_id, exc)
            self.ended(handle.job_id)
        return stopped
