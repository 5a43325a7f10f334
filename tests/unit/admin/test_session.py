"""The Python admin API (admin/session.py) on its own: which kits it takes, what it refuses
before anything is sent, and a server that is not there. The verbs against a live server are
tests/integration/federation/."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from atoll.admin.errors import ConnectionFailed, Refused
from atoll.admin.session import Session, _folder_bytes
from atoll.pki.project import parse_project
from atoll.pki.provision import provision


@pytest.fixture(scope="module")
def kits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A provisioned project whose server port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    project = parse_project({
        "name": "p",
        "server": {"name": "server", "host": "127.0.0.1", "port": port},
        "sites": [{"name": "site-1", "org": "o"}],
        "users": [{"name": "admin@o.org", "org": "o", "role": "project_admin"}],
    })
    return provision(project, tmp_path_factory.mktemp("kits")).project_dir, f"127.0.0.1:{port}"


def test_only_an_admin_kit_opens_a_session(kits):
    folder, _ = kits
    with pytest.raises(Refused, match=r"site-1 is a site kit; use an admin's kit"):
        Session(folder / "site-1")


def test_a_server_that_is_not_there_is_a_connection_failure(kits):
    folder, address = kits
    with Session(folder / "admin@o.org", timeout=10) as session:
        with pytest.raises(ConnectionFailed, match=f"cannot reach the server at {address}"):
            session.whoami()


def test_logging_in_on_open_fails_the_same_way(kits):
    folder, address = kits
    with pytest.raises(ConnectionFailed, match=f"cannot reach the server at {address}"):
        Session(folder / "admin@o.org", study="s1", timeout=10)


def test_a_job_that_is_not_a_folder_is_refused_before_any_upload(kits, tmp_path):
    folder, _ = kits
    (tmp_path / "meta.json").write_text("{}")
    with Session(folder / "admin@o.org", timeout=10) as session:
        for job in (tmp_path / "missing", tmp_path / "meta.json"):
            with pytest.raises(Refused, match="is not a job folder"):
                session.submit(job, study="s1")


def test_folder_size_is_counted_until_it_is_enough(tmp_path):
    for index in range(5):
        (tmp_path / f"f{index}").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "g").write_bytes(b"y" * 50)
    assert _folder_bytes(tmp_path, 10_000) == 550
    assert 250 <= _folder_bytes(tmp_path, 250) < 550  # stops once it has seen enough
