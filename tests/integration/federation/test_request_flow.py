"""Keys that never leave their owner, on a real federation: a site operator and a user each make
their own key and request (`atoll provision request`), the project admin signs the requests
(`atoll provision sign`), each assembles its kit (`atoll provision assemble`); the new site
joins, the new user submits a job that runs on it, and each private key exists in its owner's
folder only: none of the admin's folders ever held it."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job

ADMIN = "admin@test.org"
PEM_KEY = re.compile(rb"-----BEGIN (?:EC )?PRIVATE KEY-----.+?-----END (?:EC )?PRIVATE KEY-----",
                     re.DOTALL)
SITE = "clinic-z"
USER = "newlead@clinic-z.org"


@dataclass
class OwnKits(Federation):
    """A federation some of whose kits live in their owners' folders, not the admin's."""

    own: dict[str, Path] = field(default_factory=dict)

    def kit(self, name: str) -> Path:
        return self.own.get(name) or super().kit(name)


def atoll(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "atoll", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "ATOLL_HOME": str(cwd / ".atoll")},
                          timeout=120)
    assert proc.returncode == 0, f"atoll {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def own_kit(name: str, org: str, role: str | None, home: Path, inbox: Path,
            project: Path) -> Path:
    """The whole flow, each step in its owner's folder; only the request and the signed
    bundle travel (copied, as they would be mailed)."""
    extra = ["--role", role] if role else []
    atoll("provision", "request", "--name", name, "--org", org, *extra, "--out", str(home),
          cwd=home)
    folder = home / name
    shutil.copy(folder / f"{name}.csr", inbox)  # participant -> admin
    signed = atoll("provision", "sign", str(project), str(inbox / f"{name}.csr"), "--yes",
                   cwd=inbox)
    assert "holds no private key" in signed.stdout
    shutil.copy(inbox / f"{name}.signed.json", home)  # admin -> participant
    made = atoll("provision", "assemble", str(home / f"{name}.signed.json"), "--kit",
                 str(folder), cwd=home)
    fingerprint = signed.stdout.split("assemble their kit:\n")[1].split()[0]
    assert f"Root CA fingerprint (SHA-256): {fingerprint}" in made.stdout
    return folder


def key_body(path: Path) -> bytes:
    lines = path.read_bytes().strip().splitlines()
    assert lines[0] == b"-----BEGIN PRIVATE KEY-----"
    return b"".join(lines[1:-1])


def holders(roots: list[Path], body: bytes) -> list[Path]:
    """Every file under ``roots`` whose bytes carry the key (as PEM lines or joined)."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if body in data or body in b"".join(data.split()):
                    found.append(path)
    return found


@pytest.fixture
def federation(tmp_path):
    admin = tmp_path / "admin"
    fed = OwnKits.provisioned(admin, ["site-1"], [{"name": ADMIN, "org": "test",
                                                   "role": "project_admin"}])
    yield fed
    fed.stop_all()


def test_kits_from_the_request_sign_flow_join_and_run_a_job(federation, tmp_path):
    fed = federation
    inbox = tmp_path / "admin" / "inbox"  # where the admin keeps the requests it receives
    inbox.mkdir()
    site_home, user_home = tmp_path / "clinic-operator", tmp_path / "newlead"
    site_home.mkdir()
    user_home.mkdir()
    fed.own[SITE] = own_kit(SITE, "clinic-z", None, site_home, inbox, fed.root)
    fed.own[USER] = own_kit(USER, "clinic-z", "lead", user_home, inbox, fed.root)

    fed.start_all()
    fed.start_site(SITE)
    fed.sites.append(SITE)
    fed.wait_online(ADMIN, ["site-1", SITE])
    with fed.session(USER) as s:
        job = s.submit(make_job(user_home / "job", sites=["site-1", SITE]), wait=True,
                       timeout=180)
    assert job["state"] == "FINISHED:COMPLETED", job
    assert set(job["parts"]) == {"server", "site-1", SITE}

    for owner, home, name in ((SITE, site_home, SITE), (USER, user_home, USER)):
        key = home / name / "startup" / "client.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o700
        assert stat.S_IMODE((home / name / "startup").stat().st_mode) == 0o700
        # the key is in its owner's folder and nowhere else: not in the project folder
        # (ca/, kits, state, logs), not in the admin's inbox, not in the other's folder
        assert holders([tmp_path], key_body(key)) == [key], owner
        # and no private key anywhere in the admin's folders is that key in another encoding
        public = load_pem_private_key(key.read_bytes(), None).public_key()
        assert public not in private_keys_under(tmp_path / "admin"), owner
    assert not (fed.root / SITE).exists() and not (fed.root / USER).exists()


def private_keys_under(root: Path) -> list:
    """The public halves of every PEM private key in a file under ``root``."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            for pem in PEM_KEY.findall(path.read_bytes()):
                found.append(load_pem_private_key(pem, None).public_key())
    assert len(found) >= 4  # the CA's, the server's, site-1's and the admin's: the scan works
    return found
