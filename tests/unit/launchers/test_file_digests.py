"""The image-file digests a Slurm site states in its launch entry: the file's SHA-256, read
again when the file changes, none for what is not a regular file."""

from __future__ import annotations

import hashlib
import os

from atoll.launchers.file_digests import FileDigests


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_files_digest_is_its_sha256_and_follows_a_changed_file(tmp_path):
    image, digests = tmp_path / "w.sif", FileDigests()
    image.write_bytes(b"one" * 10_000)
    assert digests.digest(str(image)) == sha(b"one" * 10_000)
    image.write_bytes(b"two" * 10_001)  # another size: read again
    assert digests.digest(str(image)) == sha(b"two" * 10_001)
    replaced = tmp_path / "new.sif"
    replaced.write_bytes(b"six" * 10_001)  # the same size, a new file in its place
    os.replace(replaced, image)
    assert digests.digest(str(image)) == sha(b"six" * 10_001)


def test_no_digest_for_a_folder_or_a_missing_file(tmp_path):
    digests = FileDigests()
    assert digests.digest(str(tmp_path)) is None
    assert digests.digest(str(tmp_path / "missing.sif")) is None
