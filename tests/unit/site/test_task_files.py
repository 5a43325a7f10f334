"""A site parent turning the server's task stream into a handoff file for its worker."""

from __future__ import annotations

import os

import pytest

from atoll.site.worker_backend import _as_file
from atoll.wire import frames
from atoll.wire.handoff import KEY, HandoffDir


def _task(chunks: list[bytes]) -> list[bytes]:
    head = {"task_id": "t1", "topic": "train", "headers": {"round": 0}}
    return list(frames.payload_frames(head, chunks))


def test_a_task_is_written_whole_then_named_in_its_header(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    chunks = [os.urandom(frames.CHUNK), os.urandom(99)]
    out = list(_as_file(iter(_task(chunks)), parent))
    assert len(out) == 1  # the header alone: the data is in the file
    head = frames.read_header(out[0])
    assert head["task_id"] == "t1" and head["headers"] == {"round": 0}
    worker = HandoffDir(tmp_path / "h")
    assert [bytes(c) for c in frames.Payload(worker.read(head[KEY]))] == chunks


@pytest.mark.parametrize("reply", [{"none": True}, {"end": True}])
def test_no_task_yet_or_the_end_passes_through_without_a_file(tmp_path, reply):
    parent = HandoffDir(tmp_path / "h", create=True)
    assert list(_as_file(iter([frames.header(reply)]), parent)) == [frames.header(reply)]
    assert list((tmp_path / "h").iterdir()) == []


def test_a_task_stream_that_breaks_off_leaves_no_file(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)

    def broken():
        yield from _task([b"x" * 1000])[:2]
        raise ConnectionError("the server went away")

    with pytest.raises(ConnectionError):
        list(_as_file(broken(), parent))
    assert list((tmp_path / "h").iterdir()) == []


def test_a_second_header_inside_the_task_is_refused_and_leaves_no_file(tmp_path):
    parent = HandoffDir(tmp_path / "h", create=True)
    stream = _task([b"data"]) + [frames.header({"task_id": "t2"})]
    with pytest.raises(frames.FrameError, match="second header"):
        list(_as_file(iter(stream), parent))
    assert list((tmp_path / "h").iterdir()) == []
