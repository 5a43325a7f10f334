"""CPU pinning counts every launcher of this user on the host (allocation.HostCpuLeases)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from atoll.launchers.process_allocation import CpuAllocator, HostCpuLeases


@pytest.fixture
def leases(tmp_path):
    folder = tmp_path / "leases"
    folder.mkdir(mode=0o700)
    return HostCpuLeases(folder)


def test_two_launchers_of_one_host_spread_their_workers(leases):
    server, site = CpuAllocator([0, 1], leases), CpuAllocator([0, 1], leases)
    assert server.allocate("job-s", 1) == [0]
    assert site.preview(1) == [1]  # what the server took counts here too
    assert site.allocate("job-a", 1) == [1]
    assert site.allocate("job-b", 1) == [0]  # both busy once: the lowest of the least used
    server.release("job-s")
    assert site.preview(1) == [0]  # CPU 0 now holds only job-b, CPU 1 job-a
    assert CpuAllocator([0, 1, 2], leases).allocate("job-c", 2) == [0, 2]  # 2 (free), then 0 or 1: 0
    assert sorted(p.name.count("-") for p in leases.folder.glob("*.lease")) == [2, 2]


def test_a_lease_counts_while_its_process_lives_and_is_removed_after(leases):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from pathlib import Path
            from atoll.launchers.process_allocation import CpuAllocator, HostCpuLeases
            CpuAllocator([0, 1], HostCpuLeases(Path({str(leases.folder)!r}))).allocate("j", 1)
            print("held", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        mine = CpuAllocator([0, 1], leases)
        assert mine.preview(1) == [1]
        holder.kill()  # dies without releasing, as a parent killed with SIGKILL would
        holder.wait(10)
        assert mine.preview(1) == [0]
        assert not list(leases.folder.glob("*.lease"))  # the dead process's lease is gone
    finally:
        holder.kill()
        holder.wait(10)


def test_a_reused_pid_does_not_keep_a_dead_parents_lease(leases):
    # Our own pid, but another start time: the process that wrote it is gone.
    (leases.folder / f"{os.getpid()}-1-1.lease").write_text("[0]")
    assert CpuAllocator([0, 1], leases).preview(1) == [0]
    assert not (leases.folder / f"{os.getpid()}-1-1.lease").exists()


@pytest.mark.parametrize("text", ["", "{", '{"a": 1}', '["x"]', "[null]"])
def test_a_broken_lease_of_a_live_process_counts_as_nothing(leases, text):
    me = HostCpuLeases(leases.folder).new_lease()
    (leases.folder / f"{me}.lease").write_text(text)
    assert CpuAllocator([0, 1], leases).preview(1) == [0]


def test_for_host_uses_a_private_folder_of_this_user_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = HostCpuLeases.for_host()
    assert host is not None
    assert host.folder.parent == tmp_path
    assert host.folder.stat().st_mode & 0o777 == 0o700
    host.folder.chmod(0o755)  # readable by others: someone else may have made it
    assert HostCpuLeases.for_host() is None
    host.folder.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    host.folder.symlink_to(tmp_path / "elsewhere")
    assert HostCpuLeases.for_host() is None


def test_a_launcher_without_host_leases_counts_alone(leases):
    shared = CpuAllocator([0, 1], leases)
    shared.allocate("j", 1)
    assert CpuAllocator([0, 1]).preview(1) == [0]


def test_a_lease_folder_gone_later_never_fails_a_launch(leases):
    cpus = CpuAllocator([0, 1], leases)
    assert cpus.allocate("a", 1) == [0]
    for path in leases.folder.iterdir():
        path.unlink()
    leases.folder.rmdir()  # removed under the running parent (a tmp cleaner, say)
    assert cpus.allocate("b", 1) == [1]  # counted alone from here on
    cpus.release("a")
    assert cpus.preview(1) == [0]
