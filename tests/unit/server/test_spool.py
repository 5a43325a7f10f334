"""Spools: a payload held by the server between one writer and its readers."""

from __future__ import annotations

import threading

import pytest

from atoll.server import spool as spool_mod
from atoll.server.spool import Budget, SpillFiles, Spool, SpoolError
from atoll.wire import frames

FRAME = 1024


def _payload(n):
    return [frames.data(bytes([i % 251]) * FRAME) for i in range(n)]


class WatchedBudget(Budget):
    """Remembers the most it ever lent out."""

    def __init__(self, limit):
        super().__init__(limit)
        self.peak = 0

    def take(self, n):
        ok = super().take(n)
        self.peak = max(self.peak, self.used)
        return ok


def _reader(spool, name, out):
    def run():
        out[name] = b"".join(spool.read(name))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_readers_that_keep_up_get_a_live_payload_without_any_disk(tmp_path):
    budget = WatchedBudget(8 * (FRAME + 8))  # room for 8 frames, the payload is 200
    spool = Spool(SpillFiles(tmp_path), ["a", "b"], budget, live=True)
    payload = _payload(200)
    got = {}
    readers = [_reader(spool, name, got) for name in ("a", "b")]
    spool.write(payload)
    for thread in readers:
        thread.join(10)
    assert got == {"a": b"".join(payload), "b": b"".join(payload)}
    assert spool.spilled_bytes == 0 and spool.files.made == 0
    assert budget.peak <= budget.limit and budget.used == 0


def test_a_reader_that_is_late_makes_the_rest_spill_and_still_gets_everything(
        tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod, "PATIENCE_S", 0.1)
    budget = Budget(4 * (FRAME + 8))
    spool = Spool(SpillFiles(tmp_path), ["a"], budget, live=True)
    payload = _payload(50)
    spool.write(payload)  # returns: nobody read, the writer did not wait for long
    assert spool.spilled_bytes > 0 and spool.files.made == 1
    assert b"".join(spool.read("a")) == b"".join(payload)
    assert budget.used == 0


def test_a_complete_only_spool_spills_at_once_when_memory_is_taken(tmp_path):
    budget = Budget(10 * (FRAME + 8))
    assert budget.take(10 * (FRAME + 8))  # another payload holds all of it
    spool = Spool(SpillFiles(tmp_path), ["workflow"], budget, live=False)
    payload = _payload(20)
    spool.write(payload)
    assert spool.spilled_bytes == len(b"".join(payload))
    assert b"".join(spool.read("workflow")) == b"".join(payload)


def test_a_broken_upload_reaches_the_reader_as_an_error(tmp_path):
    spool = Spool(SpillFiles(tmp_path), ["a"], Budget(1 << 20), live=True)

    def broken():
        yield from _payload(3)
        raise ConnectionError("worker went away")

    with pytest.raises(ConnectionError):
        spool.write(broken())
    with pytest.raises(SpoolError, match="worker went away"):
        list(spool.read("a"))


def test_a_payload_over_the_limit_is_refused(tmp_path):
    spool = Spool(SpillFiles(tmp_path), ["a"], Budget(1 << 20), live=True)
    with pytest.raises(frames.FrameError, match="limit"):
        spool.write(_payload(10), limit=5 * FRAME)


def test_readers_that_stop_early_or_are_dropped_give_memory_back(tmp_path):
    budget = Budget(1 << 20)
    spool = Spool(SpillFiles(tmp_path), ["a", "b"], budget, live=True)
    spool.write(_payload(10))
    assert budget.used > 0
    stream = spool.read("a")
    next(stream)
    stream.close()  # e.g. the site's call was cancelled
    spool.drop("b")  # e.g. the site dropped out
    assert budget.used == 0


def test_close_frees_memory_and_file_and_ends_waiting_readers(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod, "PATIENCE_S", 0.05)
    budget = Budget(2 * (FRAME + 8))
    spool = Spool(SpillFiles(tmp_path), ["a", "b"], budget, live=True)
    spool.write(_payload(10))
    assert spool.spilled_bytes > 0
    spool.close()
    assert budget.used == 0
    assert list(spool.read("a")) == []


def test_spill_files_are_reused_from_payload_to_payload(tmp_path):
    files = SpillFiles(tmp_path)
    budget = Budget(0)  # everything spills
    big, small = _payload(30), [frames.data(b"x" * 10), frames.data(b"y" * 5)]
    for payload in (big, small, big):  # a shorter payload over a longer one's stale bytes too
        spool = Spool(files, ["workflow"], budget, live=False)
        spool.write(payload)
        assert b"".join(spool.read("workflow")) == b"".join(payload)
    assert files.made == 1 and [p.name for p in tmp_path.iterdir()] == ["spill-1"]
    files.close()


def test_a_reply_in_its_own_file_takes_no_memory_and_is_handed_over_by_name(tmp_path):
    from atoll.wire.handoff import HandoffDir

    budget = WatchedBudget(1 << 20)
    folder = HandoffDir(tmp_path / "handoff", create=True)
    spool = Spool(SpillFiles(tmp_path), ["workflow"], budget, live=False,
                  own_file=folder.create())
    payload = _payload(5)
    spool.append(payload[0])
    with pytest.raises(SpoolError, match="complete"):
        spool.hand_over()  # not while the site is still sending
    for raw in payload[1:]:
        spool.append(raw)
    spool.finish()
    assert budget.peak == 0 and spool.spilled_bytes == len(b"".join(payload))
    name = spool.hand_over()
    worker = HandoffDir(tmp_path / "handoff")
    assert b"".join(worker.read(name)) == b"".join(payload)
    worker.give_back()
    spool.close()  # the job ends later: nothing left to free, nothing removed twice
    assert list((tmp_path / "handoff").iterdir()) == []  # small: removed once read


def test_a_reply_in_its_own_file_read_through_the_spool_or_dropped_is_removed(tmp_path):
    from atoll.wire.handoff import HandoffDir

    folder = HandoffDir(tmp_path / "handoff", create=True)
    payload = _payload(3)
    read = Spool(SpillFiles(tmp_path), ["workflow"], Budget(1 << 20), live=False,
                 own_file=folder.create())
    read.write(payload)
    assert b"".join(read.read("workflow")) == b"".join(payload)  # a worker that reads frames
    abandoned = Spool(SpillFiles(tmp_path), ["workflow"], Budget(1 << 20), live=False,
                      own_file=folder.create())
    abandoned.append(payload[0])
    abandoned.close()  # the site broke off mid-reply
    assert list((tmp_path / "handoff").iterdir()) == []


def _open_files(folder) -> list[str]:
    """The files in folder that this process holds open."""
    import os

    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own, closed by now
            continue
        if target.startswith(f"{folder}/"):
            found.append(target)
    return found


def test_complete_replies_waiting_for_the_workflow_hold_no_open_file(tmp_path):
    """At 10,000 sites a round's replies wait at once: each holding its file open ran the server
    out of descriptors (EMFILE). A complete one is closed, and read or handed over as before."""
    from atoll.wire.handoff import HandoffDir

    folder = HandoffDir(tmp_path / "handoff", create=True)
    spools = []
    for i in range(50):
        spool = Spool(SpillFiles(tmp_path), ["workflow"], Budget(1 << 20), live=False,
                      own_file=folder.create())
        spool.write(_payload(2 + i % 3))
        spools.append(spool)
    assert _open_files(folder.path) == []  # fifty complete replies, no descriptor among them
    payload = b"".join(_payload(2))
    assert b"".join(spools[0].read("workflow")) == payload  # read through the spool
    worker = HandoffDir(tmp_path / "handoff")
    assert b"".join(worker.read(spools[3].hand_over())) == payload  # or taken by name
    worker.give_back()
    for spool in spools:
        spool.close()
    assert _open_files(folder.path) == []
    assert list((tmp_path / "handoff").iterdir()) == []


@pytest.mark.parametrize("spilled", [False, True])
def test_a_small_complete_payload_is_one_piece_shared_by_every_reader_that_takes_it(
        tmp_path, spilled):
    budget = Budget(0 if spilled else 1 << 20)  # no memory: every frame in the file
    spool = Spool(SpillFiles(tmp_path), ["a", "b", "c", "d"], budget, live=False)
    payload = _payload(3)
    data = b"".join(bytes(frames.data_view(raw)) for raw in payload)
    spool.write(payload)
    assert spool.whole("a", 3 * FRAME - 1) is None  # over the limit: read its frames
    first = spool.whole("a", 4 * FRAME)
    assert first == data
    assert spool.whole("b", 4 * FRAME) is first  # one copy for every reader, not one each
    assert spool.whole("a", 4 * FRAME) is None  # a reader that has it is done
    next(iter(spool.read("c")))  # a reader part-way through its frames gets no piece
    assert spool.whole("c", 4 * FRAME) is None
    assert b"".join(spool.read("d")) == b"".join(payload)  # frames still, for whoever asks
    assert spool._whole is None and budget.used == 0  # the last reader gone: all given back


def test_a_payload_still_arriving_is_not_taken_in_one_piece(tmp_path):
    spool = Spool(SpillFiles(tmp_path), ["a"], Budget(1 << 20), live=True)
    spool.append(_payload(1)[0])
    assert spool.whole("a", 1 << 20) is None
    spool.finish()
    assert spool.whole("a", 1 << 20) == b"\x00" * FRAME
