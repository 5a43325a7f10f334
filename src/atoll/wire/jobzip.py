"""Taking in a submitted job folder: a zip streamed by the admin, checked before it is kept.

Refused, with a message naming the entry: paths that escape the folder (absolute, `..`),
symbolic links, device files, more than MAX_ENTRIES entries, more than the size limit
uncompressed. Anything refused leaves nothing behind: work happens in a scratch folder that is
removed on every failure and renamed into place only when the job is accepted.

zipfile (~1 MiB once imported) and shutil (which loads bz2 and lzma) are imported where used:
parents import this module at rest, and need them only when a job comes or goes.
"""

from __future__ import annotations

import secrets
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zipfile

from atoll.wire.frames import FrameError, write_chunks

MAX_ENTRIES = 10_000


class IntakeError(Exception):
    """The job folder cannot be accepted; the message says why and what to change."""


class Incoming:
    """A scratch folder for one upload; use as a context manager so failures clean up."""

    def __init__(self, root: Path):
        self.dir = root / f"incoming-{secrets.token_hex(16)}"
        self.dir.mkdir(parents=True)
        self.zip_path = self.dir / "job.zip"
        self.tree = self.dir / "job"
        self.kept = False

    def __enter__(self) -> Incoming:
        return self

    def __exit__(self, *exc) -> None:
        import shutil

        if not self.kept:
            shutil.rmtree(self.dir, ignore_errors=True)

    def receive(self, chunks: Iterable[bytes], max_bytes: int) -> None:
        try:
            write_chunks(chunks, self.zip_path, limit=max_bytes)
        except FrameError as exc:
            raise IntakeError(f"job upload refused: {exc}") from None

    def extract(self, max_bytes: int) -> Path:
        import shutil
        import zipfile

        try:
            archive = zipfile.ZipFile(self.zip_path)
        except zipfile.BadZipFile:
            raise IntakeError("job upload is not a zip archive") from None
        with archive:
            infos = archive.infolist()
            if len(infos) > MAX_ENTRIES:
                raise IntakeError(f"job folder has {len(infos)} entries; the limit is {MAX_ENTRIES}")
            total = 0
            for info in infos:
                _check_entry(info)
                total += info.file_size
                if total > max_bytes:
                    raise IntakeError(
                        f"job folder is larger than {max_bytes} bytes uncompressed; keep data "
                        "at the sites (study datasets) and ship only code and small files")
            self.tree.mkdir()
            for info in infos:
                target = self.tree / PurePosixPath(info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        return self.tree

    def keep(self, destination: Path) -> Path:
        import shutil

        destination.parent.mkdir(parents=True, exist_ok=True)
        self.tree.rename(destination)
        self.kept = True
        shutil.rmtree(self.dir, ignore_errors=True)
        return destination


def _check_entry(info: zipfile.ZipInfo) -> None:
    name = info.filename
    path = PurePosixPath(name)
    if name.startswith("/") or "\\" in name or path.is_absolute() or ".." in path.parts:
        raise IntakeError(f"job folder entry {name!r} points outside the folder")
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver recorded no type
    if kind == stat.S_IFLNK:
        raise IntakeError(f"job folder entry {name!r} is a symbolic link; copy the file instead")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise IntakeError(f"job folder entry {name!r} is not a regular file")


def zip_folder(folder: Path, out: Path, only: Iterable[str] | None = None) -> Path:
    """Zip a job folder (or only some top-level names of it), refusing links that leave it."""
    import zipfile

    folder = folder.resolve()
    names = None if only is None else set(only)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if names is not None and rel.parts[0] not in names:
                continue
            if path.is_symlink():
                raise IntakeError(f"{rel} is a symbolic link; job folders hold plain files only")
            if path.is_dir():
                continue
            add_file(archive, path, rel.as_posix())
    return out


STORE_FROM_BYTES = 1 << 20


def add_file(archive: zipfile.ZipFile, path: Path, name: str) -> None:
    """Add a file; large ones (models, mostly incompressible) are stored, not deflated, which
    would cost seconds of CPU per GB for almost nothing."""
    import zipfile

    big = path.stat().st_size >= STORE_FROM_BYTES
    archive.write(path, name, compress_type=zipfile.ZIP_STORED if big else zipfile.ZIP_DEFLATED)


def unpack_app(archive: Path, target: str, destination: Path, scratch: Path,
               max_bytes: int = 1 << 32) -> Path:
    """Unpack the app a participant runs (from a FetchJob/FetchApp zip) into `destination`."""
    import shutil

    from atoll.spec.meta import load_meta

    scratch.mkdir(parents=True, exist_ok=True)
    with Incoming(scratch) as incoming:
        shutil.copyfile(archive, incoming.zip_path)
        tree = incoming.extract(max_bytes)
        app = load_meta(tree).app_for(target)
        if app is None or not (tree / app).is_dir():
            raise IntakeError(f"the job deploys no app to {target}")
        shutil.rmtree(destination, ignore_errors=True)
        destination.parent.mkdir(parents=True, exist_ok=True)
        (tree / app).rename(destination)
    return destination
