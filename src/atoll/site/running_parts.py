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
from pathlib import Path
from typing import TYPE_CHECKING

from atoll.base.files import PRIVATE, private_dir, write_atomic
from atoll.launchers.base import Handle
from atoll.spec.names import IdentifierError, check_job_id

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher

log = logging.getLogger("atoll.site.running_parts")

FOLDER = Path("state") / "parts"


class RunningParts:
    def __init__(self, workspace: Path):
        self.folder = workspace / FOLDER

    def launched(self, handle: Handle) -> None:
        try:  # the job runs on without it; a crash would then leave its worker unnamed
            body = {"backend": handle.backend, "native_id": handle.native_id,
                    "job_id": handle.job_id, "extra": handle.extra}
            write_atomic(private_dir(self.folder) / f"{handle.job_id}.json",
                         json.dumps(body, default=str), PRIVATE)
        except (OSError, AttributeError, TypeError, ValueError) as exc:
            log.warning("a worker's handle was not kept: %s", exc)

    def ended(self, job_id: str) -> None:
        (self.folder / f"{job_id}.json").unlink(missing_ok=True)

    def left_behind(self) -> list[Handle]:
        """The handles an earlier parent kept and never removed."""
        found = []
        if not self.folder.is_dir():
            return found
        for path in sorted(self.folder.glob("*.json")):
            try:
                doc = json.loads(path.read_text())
                found.append(Handle(str(doc["backend"]), str(doc["native_id"]),
                                    check_job_id(doc["job_id"]), dict(doc.get("extra") or {})))
            except (OSError, ValueError, KeyError, TypeError, IdentifierError) as exc:
                log.warning("ignored %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
        return found

    def stop_left_behind(self, launcher: Launcher) -> list[str]:
        """Stop each worker an earlier parent left (not a process worker: see above); the ids
        of their jobs. A dispatch of one of them then starts its part afresh."""
        stopped = []
        for handle in self.left_behind():
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
