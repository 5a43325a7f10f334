"""A pid file is removed only by the process it names: a parent that outlived a restart of its
workspace must not remove its successor's file (wrong turn 1 of issue 25)."""

from __future__ import annotations

import json
import os

from atoll.parent import pidfile


def test_a_file_naming_another_process_is_kept(tmp_path):
    pidfile.write_pid(tmp_path, "site")
    assert not pidfile.remove_own(tmp_path, "site", os.getpid() + 1)
    assert pidfile.recorded_pid(tmp_path, "site") == os.getpid()


def test_the_owner_removes_its_own_file(tmp_path):
    pidfile.write_pid(tmp_path, "site")
    assert pidfile.remove_own(tmp_path, "site", os.getpid())
    assert not pidfile.pid_file(tmp_path, "site").exists()


def test_recorded_pid_reads_a_dead_process_that_read_pid_ignores(tmp_path):
    pidfile.pid_file(tmp_path, "server").write_text(json.dumps({"pid": 2**22 + 1, "at": 0}))
    assert pidfile.read_pid(tmp_path, "server") is None
    assert pidfile.recorded_pid(tmp_path, "server") == 2**22 + 1


def test_a_live_parent_is_found_and_the_asking_process_is_not(tmp_path):
    """A killed parent's container started again in its Pod is PID 1 both times: the file
    it left names the process that asks, which is no other parent (it would refuse to start)."""
    pidfile.write_pid(tmp_path, "server")
    assert pidfile.read_pid(tmp_path, "server") is None
    pidfile.pid_file(tmp_path, "server").write_text(json.dumps({"pid": os.getppid(), "at": 0}))
    assert pidfile.read_pid(tmp_path, "server") == os.getppid()  # another process, alive
