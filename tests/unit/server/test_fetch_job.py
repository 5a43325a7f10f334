"""FetchJob's app frames: a small app is read once for every site that fetches it, and what a
site receives is the file as it is now."""

from __future__ import annotations

import os

from atoll.server import federation_service
from atoll.wire import frames


def _received(raw_frames) -> tuple[dict, bytes]:
    raw_frames = list(raw_frames)
    head = frames.read_header(raw_frames[0])
    return head, b"".join(bytes(frames.data_view(raw)) for raw in raw_frames[1:])


def test_a_small_app_is_read_once_and_shared_by_every_fetch(tmp_path):
    app = tmp_path / "app.zip"
    app.write_bytes(b"PK" + os.urandom(3000))
    first = federation_service._app_frames(app)
    assert federation_service._app_frames(app) is first  # the same frames, not a second read
    assert _received(first) == ({"size": 3002}, app.read_bytes())


def test_an_app_written_again_is_sent_as_it_is_now(tmp_path):
    app = tmp_path / "app.zip"
    app.write_bytes(b"old" * 100)
    federation_service._app_frames(app)
    app.write_bytes(b"new!" * 100)
    assert _received(federation_service._app_frames(app)) == ({"size": 400}, b"new!" * 100)


def test_a_large_app_is_read_from_its_file_for_each_fetch(tmp_path, monkeypatch):
    monkeypatch.setattr(federation_service, "APP_SHARED_MAX", 1000)
    app = tmp_path / "app.zip"
    data = os.urandom(frames.CHUNK + 500)
    app.write_bytes(data)
    one, two = federation_service._app_frames(app), federation_service._app_frames(app)
    assert one is not two
    assert _received(one) == ({"size": len(data)}, data) == _received(two)
