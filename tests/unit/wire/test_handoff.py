"""Handoff files: payloads passed between a parent and its worker through the job's folder, and
the files reused once read."""

from __future__ import annotations

import os

import pytest

from atoll.wire import frames, handoff
from atoll.wire.handoff import FREE, KEY, HandoffDir, HandoffError, payload_of


@pytest.fixture(autouse=True)
def reuse_every_file(request, monkeypatch):
    """Small files kept for reuse too, and the folder listed on every create, so each test can
    follow one file; the test of those two limits keeps them as they are."""
    if "real_limits" not in request.keywords:
        monkeypatch.setattr(handoff, "REUSE_MIN_BYTES", 1)
        monkeypatch.setattr(handoff, "_RELIST_S", 0.0)


def _filled(folder: HandoffDir, payloads: list[bytes]) -> str:
    file = folder.create()
    for chunk in payloads:
        file.handle.write(frames.data(chunk))
    return file.hand_over()


def _names(path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_a_handed_over_file_reads_back_frame_by_frame_and_is_given_back_once_let_go(tmp_path):
    parent = HandoffDir(tmp_path / "handoff", create=True)
    worker = HandoffDir(tmp_path / "handoff")
    chunks = [os.urandom(1000), b"", os.urandom(frames.CHUNK)]
    name = _filled(parent, chunks)
    assert (tmp_path / "handoff" / name).stat().st_mode & 0o777 == 0o600
    got = [bytes(c) for c in frames.Payload(worker.read(name))]
    assert got == chunks
    assert _names(tmp_path / "handoff") == [name]  # mapped until the worker gives it back
    worker.give_back()
    assert _names(tmp_path / "handoff") == [FREE + name]


def test_a_given_back_file_is_filled_again_and_cut_to_the_new_payload(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    first = _filled(parent, [b"a" * frames.CHUNK, b"b" * frames.CHUNK])
    inode = (tmp_path / "h" / first).stat().st_ino
    assert len(b"".join(worker.read(first))) > 2 * frames.CHUNK
    worker.give_back()
    second = _filled(parent, [b"short"])
    assert second != first and _names(tmp_path / "h") == [second]
    assert (tmp_path / "h" / second).stat().st_ino == inode  # the same file, its pages reused
    assert [bytes(c) for c in frames.Payload(worker.read(second))] == [b"short"]


def test_a_file_read_only_in_part_leaves_the_folder_and_its_views_stay_readable(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    name = _filled(parent, [b"kept", b"more"])
    stream = iter(frames.Payload(worker.read(name)))
    held = next(stream)
    stream.close()  # the reader stopped early
    worker.give_back()
    assert _names(tmp_path / "h") == []  # never filled again under the view still held
    assert bytes(held) == b"kept"


def test_a_frame_still_held_keeps_its_file_until_a_later_give_back(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    name = _filled(parent, [b"y"])
    view = list(frames.Payload(worker.read(name)))[0]  # read to its end, a view still held
    worker.give_back()
    assert _names(tmp_path / "h") == [name]  # not given back while the view lives
    assert bytes(view) == b"y"
    del view
    worker.give_back()
    assert _names(tmp_path / "h") == [FREE + name]


def test_a_parent_takes_its_workers_file_by_reading_and_gives_it_back_at_once(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    chunks = [os.urandom(3000), os.urandom(frames.CHUNK + 5)]
    name = worker.put(iter(chunks))
    taken = list(parent.take(name))
    assert all(isinstance(raw, bytes) for raw in taken)  # read, never mapped
    assert b"".join(taken) == b"".join(frames.data_frames(chunks))  # the frames the link sends
    assert _names(tmp_path / "h") == [FREE + name]
    again = worker.put([b"next"])  # the worker fills the file its parent gave back
    assert _names(tmp_path / "h") == [again]
    assert [bytes(c) for c in frames.Payload(parent.take(again))] == [b"next"]


def test_a_workers_file_cut_short_or_read_in_part_is_removed_not_reused(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h" / "cut").write_bytes(frames.data(b"x" * 100)[:50])
    with pytest.raises(HandoffError, match="ends inside a frame"):
        list(parent.take("cut"))
    name = HandoffDir(tmp_path / "h").put([b"a", b"b"])
    stream = parent.take(name)
    next(stream)
    stream.close()  # the parent stopped early (the upload to the server broke off)
    assert _names(tmp_path / "h") == []


def test_a_workers_file_is_taken_up_to_its_size_when_opened(tmp_path):
    """The parent tells the server a reply's size from its file before it reads it: a worker
    that grows the file meanwhile gets an error, not more bytes than were said."""
    parent = HandoffDir(tmp_path / "h", create=True)
    name = HandoffDir(tmp_path / "h").put([b"a" * 10, b"b" * 20])
    taken = parent.take(name)
    assert taken.size == len(frames.data(b"a" * 10)) + len(frames.data(b"b" * 20))
    assert sum(map(len, taken)) == taken.size
    grown = HandoffDir(tmp_path / "h").put([b"c" * 10])
    stream = parent.take(grown)
    with open(tmp_path / "h" / grown, "ab") as fh:  # the worker appends after the parent opened
        fh.write(frames.data(b"more"))
    assert b"".join(stream) == frames.data(b"c" * 10)  # what was there when it was opened
    cut = HandoffDir(tmp_path / "h").put([b"d" * 100])
    stream = parent.take(cut)
    os.truncate(tmp_path / "h" / cut, 50)  # or cuts it short
    with pytest.raises(HandoffError, match="ends inside a frame"):
        list(stream)


def test_a_failed_write_leaves_no_file(tmp_path):
    folder = HandoffDir(tmp_path / "h", create=True)

    def chunks():
        yield b"part"
        raise RuntimeError("the encoder broke")

    with pytest.raises(RuntimeError):
        folder.put(chunks())
    assert _names(tmp_path / "h") == []


def test_a_payload_names_its_file_only_where_a_folder_was_offered_and_carries_no_data(tmp_path):
    folder = HandoffDir(tmp_path / "h", create=True)
    name = folder.put([b"data"])
    no_data = frames.Payload(iter(()))
    with pytest.raises(HandoffError, match="offered no handoff folder"):
        payload_of({KEY: name}, no_data, None)
    with pytest.raises(HandoffError, match="carries data as well"):
        payload_of({KEY: name}, frames.Payload(iter([frames.data(b"x")])), folder)
    assert b"".join(payload_of({KEY: name}, no_data, folder)) == frames.data(b"data")
    plain = frames.Payload(iter([frames.data(b"over the link")]))
    assert list(payload_of({}, plain, folder)) == [frames.data(b"over the link")]


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


def test_a_symlink_a_hard_link_or_a_folder_in_the_handoff_folder_is_refused(tmp_path):
    (tmp_path / "outside").write_bytes(frames.data(b"secret"))
    folder = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h" / "link").symlink_to(tmp_path / "outside")
    os.link(tmp_path / "outside", tmp_path / "h" / "hard")
    (tmp_path / "h" / "dir").mkdir()
    for read in (folder.read, folder.take):
        with pytest.raises(HandoffError, match="cannot be opened"):
            read("link")
        with pytest.raises(HandoffError, match="not a regular file"):
            read("dir")
        with pytest.raises(HandoffError, match="with one link"):
            read("hard")
        with pytest.raises(HandoffError, match="cannot be opened"):
            read("missing")
    assert (tmp_path / "outside").read_bytes() == frames.data(b"secret")


def test_a_planted_free_file_is_never_written_through(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep")
    folder = HandoffDir(tmp_path / "h", create=True)
    (tmp_path / "h" / f"{FREE}link").symlink_to(precious)
    os.link(precious, tmp_path / "h" / f"{FREE}hard")
    (tmp_path / "h" / f"{FREE}dir").mkdir()
    name = _filled(folder, [b"payload"])
    assert precious.read_text() == "keep"
    assert (tmp_path / "h" / name).stat().st_ino != precious.stat().st_ino
    # the symlink and the folder are passed over, the hard link's name is dropped: none is used
    assert _names(tmp_path / "h") == sorted([f"{FREE}dir", f"{FREE}link", name])
    assert precious.stat().st_nlink == 1
    assert [bytes(c) for c in frames.Payload(HandoffDir(tmp_path / "h").read(name))] == [
        b"payload"]


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
    planted = f"r{os.getpid()}-1"  # the next name it would use
    (tmp_path / "h" / planted).symlink_to(target)
    name = _filled(folder, [b"payload"])
    assert name != planted and target.read_text() == "keep"
    assert (tmp_path / "h" / planted).is_symlink()


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


@pytest.mark.real_limits
def test_small_files_are_removed_once_read_and_the_folder_is_not_listed_for_each_file(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    small = worker.put([b"x" * 1000])
    assert list(parent.take(small))
    assert _names(tmp_path / "h") == []  # a small file is not worth keeping
    big = worker.put([b"y" * handoff.REUSE_MIN_BYTES])
    assert list(parent.take(big))
    assert _names(tmp_path / "h") == [FREE + big]
    # The worker listed the folder for its first file, found nothing free, and does not list
    # it again so soon: its next file is a new one, and the free one waits for a later create.
    again = worker.put([b"z" * 10])
    assert sorted(_names(tmp_path / "h")) == sorted([FREE + big, again])


@pytest.mark.real_limits
def test_a_file_read_to_its_end_is_filled_again_by_the_same_side_without_a_listing(tmp_path):
    # The site parent reads its worker's reply, then writes the next task: into the reply's
    # file, even when it listed the folder a moment ago (a fresh file's pages cost ten times
    # the CPU of reused ones).
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    parent.create().remove()  # lists the folder now: the next listing waits _RELIST_S
    reply = worker.put([b"r" * handoff.REUSE_MIN_BYTES])
    inode = (tmp_path / "h" / reply).stat().st_ino
    assert len(b"".join(parent.take(reply))) > handoff.REUSE_MIN_BYTES
    task = parent.put([b"t" * handoff.REUSE_MIN_BYTES])
    assert _names(tmp_path / "h") == [task]
    assert (tmp_path / "h" / task).stat().st_ino == inode
    # The worker, likewise, fills the task's file again once it has given it back (it listed
    # the folder for its reply a moment ago).
    assert len(b"".join(worker.read(task))) > handoff.REUSE_MIN_BYTES
    worker.give_back()
    again = worker.put([b"a" * 10])
    assert _names(tmp_path / "h") == [again]
    assert (tmp_path / "h" / again).stat().st_ino == inode


def test_a_file_the_disk_has_no_room_to_keep_is_removed_once_read(tmp_path, monkeypatch):
    # An 8 GiB model's task and replies kept for reuse are 8 GiB each on the disk: a file is
    # kept only while the disk has REUSE_ROOM times its size free. Here no disk has that room.
    free = os.statvfs(tmp_path)
    monkeypatch.setattr(handoff, "REUSE_ROOM", 2 * free.f_blocks * free.f_frsize)
    parent = HandoffDir(tmp_path / "h", create=True)
    worker = HandoffDir(tmp_path / "h")
    name = worker.put([b"r" * 1000])
    assert list(parent.take(name))
    mapped = _filled(parent, [b"t" * 1000])
    assert list(frames.Payload(worker.read(mapped)))
    worker.give_back()
    assert _names(tmp_path / "h") == []  # both removed, neither kept under a free- name
