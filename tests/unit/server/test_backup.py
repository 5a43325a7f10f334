"""The server's backup and restore (server/backup.py) on a real SQLite store in WAL mode."""

from __future__ import annotations

import os

import pytest

from atoll.server.backup import BackupError, backup, restore
from atoll.server.sqlite_store import SqliteStore


def _workspace(tmp_path):
    ws = tmp_path / "workspace"
    store = SqliteStore(ws / "atoll.db")
    store.add_job("job-1", "one", "default", "u@x.org", "x", {"name": "one"}, ["server"])
    (ws / "session.key").write_bytes(b"k" * 32)
    run = ws / "jobs" / "job-1" / "run" / "server"
    run.mkdir(parents=True)
    (run / "result.txt").write_text("kept")
    return ws, store, run


def test_a_backup_holds_the_live_store_and_the_job_files_but_no_link_or_fifo(tmp_path):
    ws, store, run = _workspace(tmp_path)
    # what a job could plant in its run folder: a link to the server's key, a FIFO
    os.symlink(ws / "session.key", run / "key-link")
    os.symlink(ws, run / "dir-link")
    os.mkfifo(run / "pipe")
    copied = backup(ws, tmp_path / "out")  # the store is still open, with a -wal file
    assert copied.skipped == 3
    restored = tmp_path / "fresh" / "workspace"
    restore(tmp_path / "out", restored)
    assert SqliteStore(restored / "atoll.db").get_job("job-1").name == "one"
    got = restored / "jobs" / "job-1" / "run" / "server"
    assert sorted(p.name for p in got.iterdir()) == ["result.txt"]
    assert (restored / "session.key").read_bytes() == b"k" * 32
    store.close()


def test_restore_refuses_a_folder_that_is_no_backup_a_broken_store_and_a_used_workspace(
        tmp_path):
    ws, store, _ = _workspace(tmp_path)
    with pytest.raises(BackupError, match="not a backup"):
        restore(tmp_path, tmp_path / "fresh")
    backup(ws, tmp_path / "out")
    with pytest.raises(BackupError, match="has state of its own"):
        restore(tmp_path / "out", ws)
    (tmp_path / "out" / "atoll.db").write_bytes(b"not sqlite" * 100)
    with pytest.raises(BackupError, match="job store"):
        restore(tmp_path / "out", tmp_path / "fresh")
    assert not (tmp_path / "fresh" / "atoll.db").exists()
    store.close()
