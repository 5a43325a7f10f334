"""Taking in a submitted job folder: a zip streamed by the admin, checked before it is kept.

Every entry is checked before anything is written, and a refusal names the entry: paths that
escape the folder (absolute, `..`) or name the folder itself (`.`), symbolic links, device
files, names with control characters, names too long or folders nested too deep for any file
system, an entry given twice, a name that is both a file and a folder, encrypted entries or
compression other than deflate, more than MAX_ENTRIES entries, more than the size limit
uncompressed. An archive that lies about an entry's size or checksum is refused as damaged when
the entry is read; an entry never yields more bytes than it declares. Anything refused leaves
nothing behind: work happens in a scratch folder that is removed on every failure and renamed
into place only when the job is accepted. Messages never name the server's own folders.

zipfile (~1 MiB once imported) and shutil (which loads bz2 and lzma) are imported where used:
parents import this module at rest, and need them only when a job comes or goes.
"""

from __future__ import annotations

import re
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zipfile

from atoll.spec.errors import EXIT_INVALID, AtollError
from atoll.wire.frames import FrameError, write_chunks

MAX_ENTRIES = 10_000
MAX_DEPTH = 32  # folders inside each other
MAX_PATH_BYTES = 1024  # an entry's whole name, well under PATH_MAX with the workspace before it
MAX_NAME_BYTES = 255  # one file or folder name: Linux's limit
# The central directory is read whole before the entries are counted: bound it first (a
# record is 46 bytes plus its name, extra field and comment).
MAX_DIRECTORY_BYTES = MAX_ENTRIES * (46 + MAX_PATH_BYTES + 256)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class IntakeError(AtollError):
    """The job folder cannot be accepted; the message says why and what to change."""

    exit_code = EXIT_INVALID


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
        except OSError as exc:
            raise IntakeError(f"job upload could not be stored: {exc.strerror}") from None

    def extract(self, max_bytes: int) -> Path:
        import shutil
        import zipfile
        import zlib

        check_directory(self.zip_path)
        try:
            archive = zipfile.ZipFile(self.zip_path)
        except UnicodeDecodeError:
            raise IntakeError("job upload is damaged: an entry's name is marked UTF-8 but is "
                              "not") from None
        except (zipfile.BadZipFile, ValueError, EOFError, OverflowError,
                NotImplementedError) as exc:  # e.g. a zip version zipfile does not read
            raise IntakeError(f"job upload is not a zip archive ({exc})") from None
        with archive:
            infos = archive.infolist()
            if len(infos) > MAX_ENTRIES:
                raise IntakeError(f"job folder has {len(infos)} entries; the limit is {MAX_ENTRIES}")
            keys = check_entries(infos, max_bytes)
            self.tree.mkdir()
            for info, key in zip(infos, keys, strict=True):
                target = self.tree.joinpath(*key)
                try:
                    if info.is_dir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(info) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                        written = dst.tell()
                    if written != info.file_size:  # zipfile stops at the size, not short of it
                        raise zipfile.BadZipFile(f"it declares {info.file_size} bytes and "
                                                 f"holds {written}")
                except OSError as exc:  # strerror only: the exception names our own path
                    raise IntakeError(f"job folder entry {info.filename!r} could not be "
                                      f"written: {exc.strerror}") from None
                except (zipfile.BadZipFile, EOFError, zlib.error, ValueError,
                        NotImplementedError) as exc:  # a local header's features zipfile lacks
                    raise IntakeError(f"job folder entry {info.filename!r} is damaged: {exc}; "
                                      "zip the folder again") from None
        return self.tree

    def keep(self, destination: Path) -> Path:
        import shutil

        destination.parent.mkdir(parents=True, exist_ok=True)
        self.tree.rename(destination)
        self.kept = True
        shutil.rmtree(self.dir, ignore_errors=True)
        return destination


def check_directory(path: Path) -> None:
    """Count the entries in the raw central directory before zipfile makes an object of each."""
    import zipfile

    with open(path, "rb") as fh:
        try:
            end = zipfile._EndRecData(fh)  # private, but the same since Python 2
        except OSError:
            end = None
        if not end:
            raise IntakeError("job upload is not a zip archive")
        size = end[zipfile._ECD_SIZE]
        if size > MAX_DIRECTORY_BYTES:
            raise IntakeError(f"job upload's list of entries is {size:,} bytes: more than "
                              f"{MAX_ENTRIES:,} entries could hold")
        start = end[zipfile._ECD_LOCATION] - size
        if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
            start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
        fh.seek(max(start, 0))
        count = fh.read(size).count(zipfile.stringCentralDir)
    if count > MAX_ENTRIES:
        raise IntakeError(f"job folder has {count} entries; the limit is {MAX_ENTRIES}")


def check_entries(infos: list[zipfile.ZipInfo], max_bytes: int) -> list[tuple[str, ...]]:
    """Each entry's path as a tuple of names, once every entry passed; else IntakeError."""
    total = 0
    keys: list[tuple[str, ...]] = []
    files: dict[tuple[str, ...], str] = {}
    folders: set[tuple[str, ...]] = set()
    for info in infos:
        key = _check_entry(info)
        keys.append(key)
        total += info.file_size
        if total > max_bytes:
            raise IntakeError(
                f"job folder is larger than {max_bytes} bytes uncompressed; keep data "
                "at the sites (study datasets) and ship only code and small files")
        if info.is_dir():
            folders.add(key)
        elif key in files:
            raise IntakeError(f"job folder entry {info.filename!r} appears twice in the archive")
        else:
            files[key] = info.filename
        folders.update(key[:i] for i in range(1, len(key)))
    for key, name in files.items():
        if key in folders:
            raise IntakeError(f"job folder entry {name!r} is both a file and a folder; "
                              "rename one of them")
    return keys


def _check_entry(info: zipfile.ZipInfo) -> tuple[str, ...]:
    import zipfile

    name = info.filename
    if _CONTROL.search(name):
        raise IntakeError(f"job folder entry {name!r} has a control character in its name; "
                          "rename it")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if name.startswith("/") or "\\" in name or ".." in parts:
        raise IntakeError(f"job folder entry {name!r} points outside the folder")
    if not parts:
        raise IntakeError(f"job folder entry {name!r} names the folder itself; give it a name")
    if len(parts) > MAX_DEPTH:
        raise IntakeError(f"job folder entry {name[:80]!r}... is {len(parts)} folders deep; "
                          f"the limit is {MAX_DEPTH}")
    if len(name.encode()) > MAX_PATH_BYTES or any(
            len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise IntakeError(f"job folder entry {name[:80]!r}... has a name too long: at most "
                          f"{MAX_NAME_BYTES} bytes a name and {MAX_PATH_BYTES} in all")
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver recorded no type
    if kind == stat.S_IFLNK:
        raise IntakeError(f"job folder entry {name!r} is a symbolic link; copy the file instead")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise IntakeError(f"job folder entry {name!r} is not a regular file")
    if info.flag_bits & 0x1:
        raise IntakeError(f"job folder entry {name!r} is encrypted; zip it without a password")
    if info.flag_bits & 0x20:  # "compressed patched data", which zipfile cannot read
        raise IntakeError(f"job folder entry {name!r} holds patched data; zip the folder again "
                          "with a plain zip tool")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise IntakeError(f"job folder entry {name!r} uses compression method "
                          f"{info.compress_type}; zip it with deflate (or store it)")
    return parts


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
               max_bytes: int = 1 << 32, check: Callable[[Path], object] | None = None) -> Path:
    """Unpack the app a participant runs (from a FetchJob/FetchApp zip) into `destination`.
    ``check(tree)`` sees the whole unpacked job first (a site verifies its signature): when it
    raises, nothing reaches `destination`. When it returns the job's meta (parsed from the
    tree's meta.json as it checked it), that meta names the app: meta.json is parsed once."""
    import shutil

    from atoll.spec.meta_plain import META_FILE, Targets, read_meta, read_meta_bytes

    scratch.mkdir(parents=True, exist_ok=True)
    with Incoming(scratch) as incoming:
        shutil.copyfile(archive, incoming.zip_path)
        tree = incoming.extract(max_bytes)
        checked = check(tree) if check is not None else None
        meta = (checked if isinstance(checked, Targets)  # PlainMeta or JobMeta
                else read_meta(read_meta_bytes(tree / META_FILE)))
        app = meta.app_for(target)
        if app is None or not (tree / app).is_dir():
            raise IntakeError(f"the job deploys no app to {target}")
        shutil.rmtree(destination, ignore_errors=True)
        destination.parent.mkdir(parents=True, exist_ok=True)
        (tree / app).rename(destination)
    return destination
