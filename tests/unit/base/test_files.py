"""base/files.py: a private file is never readable by others, not even while it is written, and
modes are set explicitly, whatever the umask."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from atoll.base import files
from atoll.base.files import PRIVATE, PUBLIC, append_private, make_private, write_atomic


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_private_file_is_0600_under_umask_0_and_from_its_first_byte(tmp_path, monkeypatch):
    target = tmp_path / "client.key"
    seen = []
    real_fdopen = os.fdopen

    def watching_fdopen(fd, *args, **kwargs):  # the moment before the first byte is written
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(files.os, "fdopen", watching_fdopen)
    with umask(0):
        write_atomic(target, b"secret", PRIVATE)
    assert seen == [0o600]
    assert mode(target) == 0o600 and target.read_bytes() == b"secret"


def test_a_public_file_stays_public_under_a_strict_umask(tmp_path):
    with umask(0o077):
        write_atomic(tmp_path / "rootCA.pem", "cert", PUBLIC)
    assert mode(tmp_path / "rootCA.pem") == 0o644


def test_a_wide_leftover_of_a_crash_is_not_written_through(tmp_path):
    target = tmp_path / "client.key"
    leftover = tmp_path / f".client.key.tmp-{os.getpid()}"
    leftover.write_text("old")
    leftover.chmod(0o666)
    with umask(0):
        write_atomic(target, b"secret", PRIVATE)
    assert mode(target) == 0o600 and not leftover.exists()


def test_make_private_and_append_private_narrow_existing_files(tmp_path):
    wide = tmp_path / "wide.log"
    wide.write_text("x")
    wide.chmod(0o644)
    make_private(wide)
    assert mode(wide) == 0o600
    wide.chmod(0o666)
    os.close(append_private(wide))
    assert mode(wide) == 0o600 and wide.read_text() == "x"
