"""The zipped app folder (plus meta.json and the signature) each participant of a job fetches:
built once per app, from the job's folder, while a thousand sites may ask at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from atoll.base.files import PRIVATE, private_dir
from atoll.pki.job_signature import SIGNATURE_FILE
from atoll.wire.job_archive import zip_folder

if TYPE_CHECKING:
    from atoll.spec.meta_plain import Meta


class AppZips:
    def __init__(self, jobs_dir: Path):
        self.jobs_dir = jobs_dir
        self._lock = threading.Lock()

    def get(self, job_id: str, target: str, meta: Meta | None) -> Path:
        """The zip of the app ``target`` runs; ``meta``: the one the running job came with
        (None when it ended since the caller found it running: read from its folder)."""
        folder = self.jobs_dir / job_id
        if meta is None:
            from atoll.spec.meta import load_meta

            meta = load_meta(folder / "job")
        app = meta.app_for(target)
        out = folder / "apps" / f"{app}.zip"
        with self._lock:  # sites fetch at the same moment; build each app's zip once
            if not out.exists():
                private_dir(out.parent)
                tmp = out.with_suffix(".part")
                zip_folder(folder / "job", tmp, only=[app, "meta.json", SIGNATURE_FILE])
                tmp.chmod(PRIVATE)
                tmp.replace(out)
        return out
