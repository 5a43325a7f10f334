"""A server worker's checkpoint kept by its parent, for a worker whose run folder goes with it.

A Kubernetes Pod works in an ``emptyDir`` that goes with the Pod: a checkpoint written there
(atoll.fl.checkpoint) would not outlive a server restart. Such a worker (``ATOLL_RESULTS_HOME=
send``, as for its results: wire/results_archive.py) sends each checkpoint home once it is
committed, before it reports it: one zip of ``checkpoint/`` (``checkpoint.json`` and the state
file it names) and ``results/`` so far (the metrics files the resumed workflow continues),
streamed over the worker link (``WorkerLink.SendCheckpoint``). The parent keeps that zip as it
came, in the job's own folder on its persistent storage (``jobs/<id>/checkpoint-home.zip``,
where no worker writes), replacing the one before atomically: a kill at any moment leaves the
earlier zip whole, or the new one. A server worker started again after a server restart fetches
it (``FetchCheckpoint``) and unpacks it into its run folder before the workflow restores, which
then finds what a process worker finds in the parent's folder.

The zip is job code's output, so the parent checks it before it replaces the one it held: bounded
in bytes and entries, names by wire/job_archive.py's rules (no absolute or climbing names, no
links), nothing outside ``checkpoint/`` and ``results/``, and a checkpoint whose state file is the
one its ``checkpoint.json`` names, with that SHA-256 and size (spec/checkpoint_manifest.py). It
never unpacks it. The resumed worker unpacks it under the same rules, and the workflow checks the
checkpoint again as it restores it (a damaged one fails the job, naming it).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from atoll.base.sha256 import sha256_for
from atoll.spec.checkpoint_manifest import MANIFEST, Manifest, parse_manifest
from atoll.wire.frames import FrameError, write_chunks
from atoll.wire.job_archive import (
    MAX_ENTRIES,
    Incoming,
    IntakeError,
    add_file,
    check_directory,
    check_entries,
)

HELD = "checkpoint-home.zip"  # in the job's folder on the parent
CHECKPOINT, RESULTS = "checkpoint", "results"  # the zip's two folders, as in the run folder
MAX_BYTES = 64 << 30  # a model of tens of GB, and its optimiser's state; the disk is the parent's


# --- the worker's side -------------------------------------------------------------------------
def zip_checkpoint(run_folder: Path, out: Path) -> Path:
    """Zip the committed checkpoint in ``run_folder/checkpoint`` and the plain files of
    ``run_folder/results`` (links and special files are not sent)."""
    import zipfile

    folder = run_folder / CHECKPOINT
    manifest = parse_manifest((folder / MANIFEST).read_bytes())
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        add_file(archive, folder / manifest.file, f"{CHECKPOINT}/{manifest.file}")
        add_file(archive, folder / MANIFEST, f"{CHECKPOINT}/{MANIFEST}")  # after what it names
        results = run_folder / RESULTS
        for root, dirs, files in os.walk(results):  # never follows a linked folder
            dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(root, d)))
            for name in sorted(files):
                path = Path(root, name)
                if stat.S_ISREG(os.lstat(path).st_mode):
                    add_file(archive, path, f"{RESULTS}/{path.relative_to(results).as_posix()}")
    return out


def unpack_checkpoint(chunks, run_folder: Path, max_bytes: int = MAX_BYTES) -> int:
    """Unpack a checkpoint the parent kept into ``run_folder`` (its ``checkpoint/`` and
    ``results/``, which must not exist yet); the round it holds. IntakeError says why not."""
    with Incoming(run_folder / "tmp") as incoming:
        incoming.receive(chunks, max_bytes)
        manifest = check(incoming.zip_path, max_bytes)
        tree = incoming.extract(max_bytes)
        for name in (CHECKPOINT, RESULTS):
            if (tree / name).is_dir():
                os.rename(tree / name, run_folder / name)
    return manifest.round


# --- the parent's side -------------------------------------------------------------------------
def keep_checkpoint(chunks, job_folder: Path, max_bytes: int = MAX_BYTES) -> dict[str, int]:
    """Check the zip a worker streams and keep it as ``job_folder/checkpoint-home.zip``, in place
    of the one before; ``{"round": k, "bytes": n}``. IntakeError (nothing kept) says why not."""
    incoming = job_folder / f".{HELD}.incoming-{secrets.token_hex(8)}"
    try:
        try:
            size = write_chunks(chunks, incoming, limit=max_bytes)
        except FrameError as exc:
            raise IntakeError(f"checkpoint refused: {exc}") from None
        manifest = check(incoming, max_bytes)
        _fsync(incoming)
        os.replace(incoming, job_folder / HELD)
        _fsync(job_folder)  # the rename itself, durably
    except OSError as exc:  # strerror only: the exception names the parent's own path
        raise IntakeError(f"the checkpoint could not be kept: {exc.strerror}") from None
    finally:
        incoming.unlink(missing_ok=True)
        incoming.with_name(incoming.name + ".part").unlink(missing_ok=True)
    return {"round": manifest.round, "bytes": size}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def held_checkpoint(job_folder: Path) -> Path | None:
    """The zip the parent keeps for the job, if any."""
    path = job_folder / HELD
    return path if path.is_file() and not path.is_symlink() else None


def check(path: Path, max_bytes: int = MAX_BYTES) -> Manifest:
    """The checkpoint a zip holds, once every rule above holds; else IntakeError naming it."""
    import zipfile
    import zlib

    check_directory(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError, OverflowError, NotImplementedError,
            UnicodeDecodeError) as exc:
        raise IntakeError(f"checkpoint refused: not a zip archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise IntakeError(f"checkpoint refused: {len(infos)} entries; the limit is "
                              f"{MAX_ENTRIES}")
        keys = check_entries(infos, max_bytes)
        outside = ["/".join(k) for k in keys if k[0] not in (CHECKPOINT, RESULTS) or len(k) < 2]
        if outside:
            raise IntakeError(f"checkpoint refused: {outside[0]!r} is outside {CHECKPOINT}/ and "
                              f"{RESULTS}/")
        by_name = {"/".join(k): info for k, info in zip(keys, infos, strict=True)}
        try:
            manifest = parse_manifest(archive.read(by_name[f"{CHECKPOINT}/{MANIFEST}"]))
        except KeyError:
            raise IntakeError(f"checkpoint refused: it holds no {CHECKPOINT}/{MANIFEST}") from None
        except ValueError as exc:
            raise IntakeError(f"checkpoint refused: its {MANIFEST} is damaged: {exc}") from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise IntakeError(f"checkpoint refused: its {MANIFEST} is damaged: {exc}") from None
        ours = {f"{CHECKPOINT}/{MANIFEST}", f"{CHECKPOINT}/{manifest.file}"}
        extra = sorted(n for n in by_name if n.startswith(f"{CHECKPOINT}/") and n not in ours)
        if extra or f"{CHECKPOINT}/{manifest.file}" not in by_name:
            raise IntakeError(f"checkpoint refused: {CHECKPOINT}/ must hold {MANIFEST} and the "
                              f"{manifest.file} it names, and nothing else")
        digest, size = sha256_for(manifest.bytes), 0
        try:  # zipfile checks the entry's CRC as it reads its end
            with archive.open(by_name[f"{CHECKPOINT}/{manifest.file}"]) as state:
                while block := state.read(1 << 20):
                    digest.update(block)
                    size += len(block)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            raise IntakeError(f"checkpoint refused: the state of round {manifest.round} is "
                              f"damaged: {exc}") from None
        if size != manifest.bytes or digest.hexdigest() != manifest.sha256:
            raise IntakeError(f"checkpoint refused: the state of round {manifest.round} is "
                              f"damaged: its SHA-256 or size does not match {MANIFEST}")
    return manifest
