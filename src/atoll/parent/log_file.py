"""A detached parent's own log, ``workspace/<role>.log``, rotated by size (``logs`` in
local/site.yaml: ``<role>.log.1`` ... ``.N`` kept). A parent in the foreground logs to its
standard error instead, for systemd's journal, which rotates on its own.

What is not a log record (a traceback printed at exit, gRPC's own C-level messages) goes to the
process's stdout and stderr: both are pointed at the current file at start and after each
rotation, so they never keep writing into a file that was rotated away.
"""

from __future__ import annotations

import logging.handlers
import os
from pathlib import Path

from atoll.base.files import append_private


class ParentLog(logging.handlers.RotatingFileHandler):
    def __init__(self, path: Path, max_bytes: int, keep: int):
        super().__init__(path, maxBytes=max_bytes, backupCount=keep, encoding="utf-8")
        self._follow()

    def _open(self):
        # 0600 whatever the umask: a log can quote the parent's configuration
        return os.fdopen(append_private(Path(self.baseFilename)), "a", encoding="utf-8")

    def doRollover(self) -> None:
        super().doRollover()
        self._follow()

    def _follow(self) -> None:
        if self.stream is not None:
            for fd in (1, 2):
                os.dup2(self.stream.fileno(), fd)
