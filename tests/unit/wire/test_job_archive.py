"""Taking in a submitted job zip (wire/job_archive.py) without a server: each entry the intake
refuses is refused by name before anything is written, and a refusal leaves nothing behind.
The live server's side of the same cases is tests/integration/federation/test_intake.py."""

from __future__ import annotations

import stat
import struct
import zipfile
from pathlib import Path

import pytest

from atoll.wire import job_archive
from atoll.wire.job_archive import Incoming, IntakeError

LIMIT = 1 << 20


def _zip(path: Path, entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return path


def _info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = mode << 16
    return info


def _extract(tmp_path: Path, entries, max_bytes: int = LIMIT) -> Path:
    scratch = tmp_path / "scratch"
    with Incoming(scratch) as incoming:
        _zip(incoming.zip_path, entries)
        tree = incoming.extract(max_bytes)
        return incoming.keep(tmp_path / "kept") if tree else tree


def _refused(tmp_path: Path, entries, match: str, max_bytes: int = LIMIT) -> None:
    with pytest.raises(IntakeError, match=match):
        _extract(tmp_path, entries, max_bytes)
    scratch = tmp_path / "scratch"
    assert list(scratch.iterdir()) == [], "a refused upload left files behind"
    assert not (tmp_path / "kept").exists()


def test_a_plain_job_folder_is_taken_in_whole(tmp_path):
    kept = _extract(tmp_path, [("meta.json", b"{}"), ("app/train.py", b"print(1)\n"),
                               ("app/data/", b""), ("./app/x.txt", b"x")])
    assert (kept / "meta.json").read_bytes() == b"{}"
    assert (kept / "app/train.py").read_bytes() == b"print(1)\n"
    assert (kept / "app/x.txt").read_bytes() == b"x" and (kept / "app/data").is_dir()
    assert list((tmp_path / "scratch").iterdir()) == []


@pytest.mark.parametrize("name", ["../evil.py", "app/../../evil.py", "app/..", "..",
                                  "a/b/../../../c"])
def test_a_dot_dot_entry_is_refused(tmp_path, name):
    _refused(tmp_path, [("meta.json", b"{}"), (name, b"x")], "points outside the folder")
    assert not (tmp_path / "evil.py").exists()


@pytest.mark.parametrize("name", ["/etc/cron.d/evil", "/evil.py", "app\\..\\evil.py"])
def test_an_absolute_or_backslashed_entry_is_refused(tmp_path, name):
    _refused(tmp_path, [("meta.json", b"{}"), (name, b"x")], "points outside the folder")


@pytest.mark.parametrize("name", [".", "./", "./."])
def test_an_entry_naming_the_folder_itself_is_refused(tmp_path, name):
    info = zipfile.ZipInfo(name)  # ZipFile.writestr would add a name of its own
    _refused(tmp_path, [("meta.json", b"{}"), (info, b"x")], "names the folder itself")


def test_an_entry_given_twice_is_refused(tmp_path):
    with pytest.warns(UserWarning, match="Duplicate name"):
        _refused(tmp_path, [("meta.json", b"{}"), ("app/train.py", b"good"),
                            ("app/train.py", b"evil")], "appears twice")


def test_the_same_file_spelled_twice_is_refused(tmp_path):
    _refused(tmp_path, [("app/train.py", b"good"), ("./app//train.py", b"evil")],
             "appears twice")


def test_a_name_that_is_both_a_file_and_a_folder_is_refused(tmp_path):
    _refused(tmp_path, [("app", b"a file"), ("app/train.py", b"x")], "both a file and a folder")


def test_a_symbolic_link_is_refused(tmp_path):
    link = _info("app/key.pem", stat.S_IFLNK | 0o777)
    _refused(tmp_path, [("meta.json", b"{}"), (link, b"/etc/atoll/client.key")],
             "is a symbolic link")


@pytest.mark.parametrize("kind", [stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK])
def test_a_device_or_fifo_is_refused(tmp_path, kind):
    _refused(tmp_path, [(_info("app/dev", kind | 0o600), b"")], "is not a regular file")


def test_a_control_character_in_a_name_is_refused(tmp_path):
    _refused(tmp_path, [("app/a\nb.py", b"x")], "control character")


def test_folders_nested_too_deep_are_refused(tmp_path):
    name = "/".join(["d"] * (job_archive.MAX_DEPTH + 1)) + ".py"
    _refused(tmp_path, [(name, b"x")], "folders deep")


def test_a_name_too_long_is_refused(tmp_path):
    _refused(tmp_path, [("app/" + "n" * 256, b"x")], "name too long")
    _refused(tmp_path, [("/".join(["n" * 200] * 6), b"x")], "name too long")


def _with_flags(tmp_path: Path, flags: int) -> bytes:
    """A one-entry zip whose entry carries general-purpose ``flags`` (ZipFile clears them)."""
    raw = bytearray(_zip(tmp_path / "flags.zip", [("app/secret.py", b"x")]).read_bytes())
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.index(signature) + offset
        struct.pack_into("<H", raw, at, struct.unpack_from("<H", raw, at)[0] | flags)
    return bytes(raw)


@pytest.mark.parametrize(("flags", "match"), [
    (0x1, "is encrypted; zip it without a password"),
    (0x20, "holds patched data; zip the folder again with a plain zip tool")])
def test_an_encrypted_or_patched_entry_is_refused(tmp_path, flags, match):
    data = _with_flags(tmp_path, flags)
    with Incoming(tmp_path / "scratch") as incoming:
        incoming.zip_path.write_bytes(data)
        with pytest.raises(IntakeError, match=match):
            incoming.extract(LIMIT)
        assert not incoming.tree.exists()  # refused before anything was written


def test_a_compression_other_than_deflate_is_refused(tmp_path):
    info = zipfile.ZipInfo("app/train.py")
    info.compress_type = zipfile.ZIP_BZIP2
    _refused(tmp_path, [(info, b"x" * 100)], "compression method 12")


def test_more_entries_than_the_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(job_archive, "MAX_ENTRIES", 5)
    _refused(tmp_path, [(f"app/{i}.py", b"x") for i in range(6)], "6 entries; the limit is 5")


def test_more_entries_than_the_limit_are_refused_before_zipfile_reads_them(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(job_archive, "MAX_ENTRIES", 5)
    data = _zip(tmp_path / "many.zip", [(f"{i}", b"") for i in range(6)]).read_bytes()

    def never(*args, **kwargs):
        raise AssertionError("zipfile read an archive with too many entries")

    monkeypatch.setattr(zipfile, "ZipFile", never)
    with Incoming(tmp_path / "scratch") as incoming:
        incoming.zip_path.write_bytes(data)
        with pytest.raises(IntakeError, match="6 entries; the limit is 5"):
            incoming.extract(LIMIT)


def test_the_entry_list_is_counted_again_as_zipfile_reads_it(tmp_path, monkeypatch):
    # a second line behind the raw count of the central directory
    monkeypatch.setattr(job_archive, "MAX_ENTRIES", 5)
    monkeypatch.setattr(job_archive, "check_directory", lambda path: None)
    _refused(tmp_path, [(f"app/{i}.py", b"x") for i in range(6)], "6 entries; the limit is 5")


def test_a_folder_larger_than_the_limit_uncompressed_is_refused(tmp_path):
    # a zip bomb: a few KiB on the wire, far more once inflated
    _refused(tmp_path, [("app/a.bin", b"\0" * 600_000), ("app/b.bin", b"\0" * 600_000)],
             "larger than 1048576 bytes uncompressed")


def test_an_entry_that_lies_about_its_size_never_yields_more(tmp_path):
    path = tmp_path / "lie.zip"
    _zip(path, [("app/a.bin", b"\0" * 600_000)])
    raw = bytearray(path.read_bytes())
    central = raw.rindex(b"PK\x01\x02")
    struct.pack_into("<I", raw, central + 24, 10)  # declares 10 bytes uncompressed
    local = raw.index(b"PK\x03\x04")
    struct.pack_into("<I", raw, local + 22, 10)
    scratch = tmp_path / "scratch"
    with Incoming(scratch) as incoming:
        incoming.zip_path.write_bytes(bytes(raw))
        with pytest.raises(IntakeError, match="is damaged"):
            incoming.extract(LIMIT)
        written = incoming.tree / "app/a.bin"
        assert not written.exists() or written.stat().st_size <= 10
    assert list(scratch.iterdir()) == []


def test_something_not_a_zip_is_refused(tmp_path):
    scratch = tmp_path / "scratch"
    with Incoming(scratch) as incoming:
        incoming.zip_path.write_bytes(b"not a zip at all" * 10)
        with pytest.raises(IntakeError, match="not a zip archive"):
            incoming.extract(LIMIT)
    assert list(scratch.iterdir()) == []


def test_an_entry_that_holds_less_than_it_declares_is_refused(tmp_path):
    # deflate data that ends after 10 bytes, with their CRC, declared as 600,000 bytes: zipfile
    # stops at the end of the data and finds nothing wrong
    path = tmp_path / "short.zip"
    _zip(path, [("app/a.bin", b"0123456789")])
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, raw.rindex(b"PK\x01\x02") + 24, 600_000)
    struct.pack_into("<I", raw, raw.index(b"PK\x03\x04") + 22, 600_000)
    with Incoming(tmp_path / "scratch") as incoming:
        incoming.zip_path.write_bytes(bytes(raw))
        with pytest.raises(IntakeError, match="is damaged: it declares 600000 bytes and holds 10"):
            incoming.extract(LIMIT)
    assert list((tmp_path / "scratch").iterdir()) == []
