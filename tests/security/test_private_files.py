"""Files at rest are private whatever the umask: workspaces and job folders 0700, the job store,
logs, results and payloads 0600. Parents here start with umask 000, the worst an operator's
shell could hand them."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from atoll.base.files import append_private, private_dir
from atoll.parent import detach
from atoll.server.relay import JobRelay
from atoll.server.spool import Budget, SpillFiles
from atoll.server.sqlite_store import SqliteStore
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def open_to_others(root: Path) -> list[str]:
    """Everything under root (root too) that a group or other user could read or enter."""
    found = []
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        if not stat.S_ISLNK(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
            found.append(f"{oct(stat.S_IMODE(info.st_mode))} {path.relative_to(root)}")
    return found


def test_a_federation_started_with_umask_0_keeps_everything_private(tmp_path):
    fed = Federation.provisioned(tmp_path, ["site-1"], USERS)
    try:
        with umask(0):  # the parents inherit it; nothing they keep may show
            fed.start_all()
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as s:
            job = s.submit(make_job(tmp_path / "job", rounds=1), wait=True, timeout=120)
            s.download(job["job_id"], tmp_path / "download")
        assert job["state"] == "FINISHED:COMPLETED", job
    finally:
        fed.stop_all()
    server, site = fed.workspace("server"), fed.workspace("site-1")
    job_dir = server / "jobs" / job["job_id"]
    assert (job_dir / "run" / "server" / "results").is_dir()
    assert (site / "jobs" / job["job_id"] / "logs").is_dir()
    for folder in (server, site, server / "jobs", site / "jobs", job_dir, job_dir / "run" /
                   "server", site / "jobs" / job["job_id"]):
        assert mode(folder) == 0o700, folder
    for name in ("atoll.db", "atoll.db-wal", "atoll.db-shm"):
        if (server / name).exists():  # -wal and -shm may be gone after a clean stop
            assert mode(server / name) == 0o600, name
    assert mode(job_dir / "logs" / "site-1.log") == 0o600
    assert open_to_others(server) == []
    assert open_to_others(site) == []


def test_the_job_store_is_0600_with_its_wal_and_shm(tmp_path):
    with umask(0):
        store = SqliteStore(tmp_path / "atoll.db")
        store.add_job("j1", "name", "default", "me", "org", {}, ["server"])
    try:
        for name in ("atoll.db", "atoll.db-wal", "atoll.db-shm"):
            assert mode(tmp_path / name) == 0o600, name
    finally:
        store.close()


def test_a_store_left_wider_by_an_older_atoll_is_narrowed(tmp_path):
    with umask(0):
        SqliteStore(tmp_path / "atoll.db").close()
    for name in ("atoll.db", "atoll.db-wal", "atoll.db-shm"):
        if (tmp_path / name).exists():
            (tmp_path / name).chmod(0o644)
    SqliteStore(tmp_path / "atoll.db").close()
    for name in ("atoll.db", "atoll.db-wal", "atoll.db-shm"):
        if (tmp_path / name).exists():
            assert mode(tmp_path / name) == 0o600, name


def test_relay_folders_and_spilled_payloads_are_private(tmp_path):
    with umask(0):
        relay = JobRelay("j1", tmp_path / "relay", ["site-1"], Budget(0), handoff=True)
        spill = SpillFiles(relay.folder).take()
    try:
        assert mode(tmp_path / "relay") == 0o700
        assert mode(tmp_path / "relay" / "handoff") == 0o700
        assert [mode(p) for p in (tmp_path / "relay").glob("spill-*")] == [0o600]
    finally:
        spill.close()
        relay.close()


def test_private_dir_and_append_private_narrow_what_exists(tmp_path):
    wide = tmp_path / "workspace"
    wide.mkdir(mode=0o755)
    log = wide / "site.log"
    log.write_text("old\n")
    log.chmod(0o644)
    with umask(0):
        assert private_dir(wide) == wide
        os.close(append_private(log))
        os.close(append_private(wide / "new.log"))
    assert mode(wide) == 0o700
    assert mode(log) == 0o600 and log.read_text() == "old\n"
    assert mode(wide / "new.log") == 0o600


def test_a_detached_parents_log_and_workspace_are_private(tmp_path):
    """`atoll site start --detach`: its log file may quote its configuration."""
    workspace = tmp_path / "workspace"
    with umask(0), pytest.raises(RuntimeError, match="exited with code"):
        detach.start_detached("site", tmp_path / "no-such-kit", workspace, timeout=60)
    assert mode(workspace) == 0o700
    assert mode(workspace / "site.log") == 0o600


def test_private_dir_makes_the_folders_on_the_way_private_too(tmp_path):
    with umask(0):
        private_dir(tmp_path / "jobs" / "j1" / "run" / "server")
    for rel in ("jobs", "jobs/j1", "jobs/j1/run", "jobs/j1/run/server"):
        assert mode(tmp_path / rel) == 0o700, rel
