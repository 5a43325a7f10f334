"""A detached parent's log (parent/log_file.py), in a process of its own since it takes over
fds 1 and 2: rotated by size, N old files kept, 0600, and what is written to stderr outside
logging lands in the current file, not in one rotated away."""

from __future__ import annotations

import stat
import subprocess
import sys

SCRIPT = '''
import logging, sys
from pathlib import Path
from atoll.parent.run import setup_logging

setup_logging(False, Path(sys.argv[1]), (4000, 2))
log = logging.getLogger("atoll.test")
for i in range(200):
    log.info("line %d %s", i, "x" * 40)
print("printed to stderr after the rotations", file=sys.stderr, flush=True)
'''


def test_the_log_rotates_by_size_keeps_n_files_and_stderr_follows(tmp_path):
    path = tmp_path / "site.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # all of it went to the file
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["site.log", "site.log.1", "site.log.2"], names
    for name in names:
        assert (tmp_path / name).stat().st_size <= 4000 + 200
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    current = path.read_text()
    assert "line 199" in current and "printed to stderr after the rotations" in current
    assert "level=INFO component=atoll.test" in current
    assert "line 0 " not in "".join((tmp_path / n).read_text() for n in names)  # dropped
