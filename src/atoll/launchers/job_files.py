"""How a parent reads (and writes) the files in a job's run folder without trusting them.

Job code can write its own run folder, so it can swap any file there for a symbolic link (to
``/proc/<parent pid>/environ``, to the site's ``startup/client.key``), a hard link, a FIFO that
blocks its reader forever, or turn a folder on the way (``logs/``) into a link to ``/``. A parent
that opened such a path plainly would read its own secrets as the job's output and pass them on
as the job's log or results. So here every path is walked from the run folder one component at a
time, each opened relative to the last with O_NOFOLLOW (folders with O_DIRECTORY as well), and
only a regular file with one link is read, up to a size limit. A missing file is a plain
FileNotFoundError; anything refused is a JobFileError naming the path inside the run folder.

The run folder itself is the parent's (it made it), so its own path may go through links the
site operator set up (a workspace on a mounted volume).

This module imports nothing from atoll: launchers, site and server parents all use it.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from atoll.spec.errors import EXIT_INVALID, AtollError

MAX_BYTES = 64 * 1024 * 1024  # read_job_file / open_job_file: more is refused, not cut
MAX_DEPTH = 32  # iter_job_files: folders nested deeper are skipped with a note
MAX_FILES = 100_000  # iter_job_files: a results folder with more entries is refused

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted where a file was expected must not block the parent's open.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class JobFileError(AtollError, OSError):
    """A file of a job's run folder that a parent refuses to read or write."""

    exit_code = EXIT_INVALID

    def __init__(self, rel: str, problem: str):
        super().__init__(f"{rel} in the job's run folder {problem}; a parent reads a job's "
                         "files only as regular files inside its run folder, never through a link")
        self.rel = rel


def _parts(rel: str | os.PathLike[str]) -> list[str]:
    text = os.fspath(rel)
    path = PurePosixPath(text)
    parts = [p for p in path.parts if p != "."]
    if path.is_absolute() or not parts or ".." in parts or "\\" in text or "\0" in text:
        raise JobFileError(text, "is not a plain path inside the folder (absolute, empty or ..)")
    return parts


def _refusal(rel: str, err: OSError, dir_fd: int | None = None, name: str = "") -> OSError:
    if err.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, f"{rel} does not exist in the job's run folder")
    if err.errno in (errno.ELOOP, errno.EMLINK):  # what O_NOFOLLOW answers for a link
        return JobFileError(rel, "is a symbolic link")
    if err.errno == errno.ENOTDIR:  # O_DIRECTORY|O_NOFOLLOW on a link answers this on Linux
        if dir_fd is not None and _is_link(dir_fd, name):
            return JobFileError(rel, "is a symbolic link")
        return JobFileError(rel, "is not a folder")
    return JobFileError(rel, f"cannot be opened: {err.strerror}")


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk(run_folder: Path, parts: list[str]) -> int:
    """A descriptor of the folder ``parts`` names inside the run folder, no link followed."""
    fd = os.open(run_folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                inner = os.open(part, _DIR, dir_fd=fd)
            except OSError as err:  # named as far as the walk got: `logs`, not the file
                raise _refusal("/".join(parts[: i + 1]), err, fd, part) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_in(dir_fd: int, name: str, rel: str, max_bytes: int | None) -> io.FileIO:
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError as err:
        raise _refusal(rel, err) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise JobFileError(rel, "is not a regular file")
        if info.st_nlink != 1:  # a hard link may share its inode with a file of the parent's
            raise JobFileError(rel, f"has {info.st_nlink} hard links")
        if max_bytes is not None and info.st_size > max_bytes:
            raise JobFileError(rel, f"is larger than the limit of {max_bytes} bytes")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return io.FileIO(fd, "rb")


def open_job_file(run_folder: Path, rel: str | os.PathLike[str],
                  max_bytes: int | None = MAX_BYTES) -> io.FileIO:
    """The regular file ``rel`` inside ``run_folder``, opened for reading without following
    any link; ``max_bytes=None`` for no size limit (the caller streams it)."""
    parts = _parts(rel)
    text = "/".join(parts)
    dir_fd = _walk(Path(run_folder), parts[:-1])
    try:
        return _open_in(dir_fd, parts[-1], text, max_bytes)
    finally:
        os.close(dir_fd)


def read_job_file(run_folder: Path, rel: str | os.PathLike[str],
                  max_bytes: int = MAX_BYTES) -> bytes:
    """The whole of a job's file, refused when it is (or grows) larger than ``max_bytes``."""
    with open_job_file(run_folder, rel, max_bytes) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise JobFileError(os.fspath(rel), f"is larger than the limit of {max_bytes} bytes")
    return data


def read_tail(run_folder: Path, rel: str | os.PathLike[str], limit: int) -> bytes:
    """The last ``limit`` bytes (at most) of a job's file, such as its log."""
    with open_job_file(run_folder, rel, max_bytes=None) as handle:
        size = os.fstat(handle.fileno()).st_size
        return os.pread(handle.fileno(), limit, max(0, size - limit))


def iter_job_files(run_folder: Path, rel: str | os.PathLike[str],
                   skipped: list[str]) -> Iterator[tuple[str, io.FileIO]]:
    """Every regular file under the folder ``rel`` (sorted paths relative to it, each opened),
    walked without following links. What is not read (links, FIFOs, hard-linked files...) is
    appended to ``skipped`` as a line saying why. A missing folder yields nothing."""
    parts = _parts(rel)
    try:
        fd = _walk(Path(run_folder), parts)
    except FileNotFoundError:
        return
    seen = [0]
    try:
        yield from _files_under(fd, "/".join(parts), "", skipped, 0, seen)
    finally:
        os.close(fd)


def _files_under(fd: int, base: str, prefix: str, skipped: list[str], depth: int,
                 seen: list[int]) -> Iterator[tuple[str, io.FileIO]]:
    for name in sorted(os.listdir(fd)):
        seen[0] += 1
        if seen[0] > MAX_FILES:
            raise JobFileError(base, f"holds more than {MAX_FILES} entries")
        inner = f"{prefix}{name}"
        full = f"{base}/{inner}"
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone while listed
        if stat.S_ISDIR(info.st_mode):
            if depth >= MAX_DEPTH:
                skipped.append(str(JobFileError(full, f"is nested more than {MAX_DEPTH} deep")))
                continue
            try:
                sub = os.open(name, _DIR, dir_fd=fd)
            except OSError as err:  # swapped for a link since it was listed
                skipped.append(str(_refusal(full, err, fd, name)))
                continue
            try:
                yield from _files_under(sub, base, f"{inner}/", skipped, depth + 1, seen)
            finally:
                os.close(sub)
            continue
        try:
            handle = _open_in(fd, name, full, None)
        except OSError as err:
            skipped.append(str(err))  # it names the path
            continue
        with handle:
            yield inner, handle


def create_job_file(run_folder: Path, rel: str | os.PathLike[str]) -> io.FileIO:
    """A new file ``rel`` in a job's run folder (the folders on the way must exist), for a parent
    that writes there (a worker's saved log, a site's log tail). Whatever was at that name is
    removed first, never written through; the file is 0600 whatever the umask."""
    parts = _parts(rel)
    text = "/".join(parts)
    dir_fd = _walk(Path(run_folder), parts[:-1])
    try:
        try:
            os.unlink(parts[-1], dir_fd=dir_fd)  # a link planted there goes, not its target
        except FileNotFoundError:
            pass
        except OSError as err:  # a folder, most likely
            raise JobFileError(text, f"cannot be replaced: {err.strerror}") from None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, 0o600, dir_fd=dir_fd)
        except OSError as err:  # planted again between unlink and open
            raise _refusal(text, err) from None
        os.fchmod(fd, 0o600)  # O_CREAT's mode only ever loses bits to the umask; say it anyway
        return io.FileIO(fd, "wb")
    finally:
        os.close(dir_fd)
