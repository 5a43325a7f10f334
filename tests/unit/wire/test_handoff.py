"""Handoff files: a reply passed from the server parent to its worker through the job's folder."""

from __future__ import annotations

import os

import pytest

from atoll.wire import frames
from atoll.wire.handoff import HandoffDir, HandoffError


def _filled(folder: HandoffDir, payloads: list[bytes]) -> str:
    file = folder.create()
    for chunk in payloads:
        file.handle.write(frames.data(chunk))
    return file.hand_over()


def test_a_handed_over_file_reads_back_frame_by_frame_and_leaves_the_folder(tmp_path):
    parent = HandoffDir(tmp_path / "handoff", create=True)
    worker = HandoffDir(tmp_path / "handoff")
    chunks = [os.urandom(1000), b"", os.urandom(frames.CHUNK)]
    name = _filled(parent, chunks)
    assert (tmp_path / "handoff" / name).stat().st_mode & 0o777 == 0o600
    stream = worker.read(name)
    assert not (tmp_path / "handoff" / name).exists()  # gone as soon as it is opened
    assert [bytes(c) for c in frames.Payload(stream)] == chunks


def test_a_removed_file_is_gone_and_names_are_never_reused(tmp_path):
    folder = HandoffDir(tmp_path / "h", create=True)
    first, second = folder.create(), folder.create()
    assert first.name != second.name
    first.remove()
    assert not (tmp_path / "h" / first.name).exists()
    assert (tmp_path / "h" / second.name).exists()


@pytest.mark.parametrize("name", ["../outside", "a/b", ".hidden", "", "x" * 200, 7])
def test_only_plain_names_inside_the_folder_are_read(tmp_path, name):
    (tmp_path / "outside").write_bytes(frames.data(b"secret"))
    folder = HandoffDir(tmp_path / "h", create=True)
    with pytest.raises(HandoffError, match="not a plain file name"):
        folder.read(name)
    assert (tmp_path / "outside").exists()


def test_a_symlink_or_a_folder_in_the_handoff_folder_is_refused(tmp_path):
    (tmp_path / "outside").write_bytes(frames.data(b"secret"))
    folder = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "h" / "dir").mkdir()
    with pytest.raises(HandoffError, match="cannot be opened"):
        folder.read("link")
    with pytest.raises(HandoffError, match="not a regular file"):
        folder.read("dir")
    with pytest.raises(HandoffError, match="cannot be opened"):
        folder.read("missing")


def test_a_file_that_is_not_whole_data_frames_is_an_error(tmp_path):
    folder = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h" / "cut").write_bytes(frames.data(b"x" * 100)[:50])
    (tmp_path / "h" / "junk").write_bytes(b"\x00\x01\x02 not frames")
    (tmp_path / "h" / "head").write_bytes(frames.header({"a": 1}))
    with pytest.raises(HandoffError, match="ends inside a frame"):
        list(folder.read("cut"))
    with pytest.raises(frames.FrameError, match="not a frame"):
        list(folder.read("junk"))
    with pytest.raises(frames.FrameError, match="header frame"):
        list(folder.read("head"))


def test_new_files_never_follow_a_planted_symlink(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep")
    folder = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h" / f"r{os.getpid()}-1").symlink_to(target)  # the next name it would use
    with pytest.raises(FileExistsError):
        folder.create()
    assert target.read_text() == "keep"


def test_the_folder_is_held_open_so_swapping_it_for_a_symlink_moves_nothing(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h").rename(tmp_path / "moved")
    (tmp_path / "h").symlink_to(elsewhere)
    name = _filled(folder, [b"data"])
    assert (tmp_path / "moved" / name).exists()
    assert list(elsewhere.iterdir()) == []


def _rss_file_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssFile:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_a_large_file_is_read_through_a_mapping_that_does_not_stay_in_memory(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    chunks = [bytes([i]) * frames.CHUNK for i in range(64)]  # 64 MiB
    name = _filled(parent, chunks)
    before = _rss_file_kib()
    highest, kept = before, None
    for i, chunk in enumerate(frames.Payload(HandoffDir(tmp_path / "h").read(name))):
        assert isinstance(chunk, memoryview) and chunk.readonly  # a view of the page cache
        assert chunk == chunks[i]  # every page of it touched
        highest = max(highest, _rss_file_kib())
        if i == 3:
            kept = chunk  # held past the end of the read
    assert highest - before < 40 * 1024  # pages dropped as it went; not all 64 MiB mapped
    assert bytes(kept[:2]) == b"\x03\x03"  # still readable: the mapping lives while a view does
