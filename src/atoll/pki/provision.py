"""``atoll provision``: a project folder with its CA and one startup kit per participant.

``DIR/<project>/`` after provisioning::

    ca/            rootCA.pem, rootCA.key (0600), state.json: kept by the project admin only
    server/        startup/{server.crt, server.key, rootCA.pem, kit.yaml, kit.json, project.json},
                   local/
    <site>/        startup/{client.crt, client.key, rootCA.pem, kit.yaml, kit.json}, local/
    <user>/        startup/{client.crt, client.key, rootCA.pem, kit.yaml, kit.json}

Everything is written into a temporary folder next to the target and renamed into place at the
end, so a failure leaves nothing half-written. ``add_site`` / ``add_user`` sign one more
participant with the existing CA and write only its kit (and ``ca/state.json``): no other kit
changes, not even the server's ``project.json``; the server learns of a new site when it
connects with a certificate of this CA. ``write_startup`` / ``write_local`` also assemble a kit
whose key its owner made (``request.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.base.files import PUBLIC, write_atomic
from atoll.pki.ca import CertificateAuthority, create_ca, load_ca, save_ca
from atoll.pki.certs import Kind, issue_cert
from atoll.pki.kit import (
    CA_FILE,
    KIT_CACHE_FILE,
    KIT_FILE,
    PROJECT_FILE,
    cert_file_names,
    render_kit_json,
    render_kit_yaml,
)
from atoll.pki.project import Project
from atoll.pki.state import (
    STATE_VERSION,
    ProvisionError,
    add_entry,
    check_new,
    identity_checks,
    locked,
    record,
    write_state,
)
from atoll.pki.templates import authorization_json, site_yaml, study_runtime_yaml

__all__ = ["ProvisionError", "ProvisionResult", "WrittenKit", "add_site", "add_user", "provision"]

if TYPE_CHECKING:
    from cryptography import x509

SERVER_DIR = "server"


@dataclass(frozen=True)
class WrittenKit:
    name: str
    kind: Kind
    org: str
    role: str | None
    path: Path


@dataclass(frozen=True)
class ProvisionResult:
    project_dir: Path
    ca_dir: Path
    kits: list[WrittenKit]


@dataclass(frozen=True)
class Target:
    """What a new kit needs to know about the federation: its project and where the server is."""

    project: str
    server_host: str
    server_port: int


def _write_kit(
    dest: Path,
    ca: CertificateAuthority,
    target: Target,
    *,
    name: str,
    org: str,
    kind: Kind,
    role: str | None = None,
    listen: tuple[str, int] | None = None,
    startup_extra: dict[str, str] | None = None,
    local: dict[str, str] | None = None,
) -> x509.Certificate:
    """Sign ``name`` and write its kit into the new folder ``dest``."""
    hosts = (target.server_host,) if kind == "server" else ()
    issued = issue_cert(ca, name, org, kind, role, hosts=hosts)
    startup = dest / "startup"
    startup.mkdir(mode=0o700, parents=True)
    cert_name, key_name = cert_file_names(kind)
    issued.write(startup / cert_name, startup / key_name)
    write_startup(startup, ca.cert_pem(), target, name=name, org=org, kind=kind, role=role,
                  listen=listen)
    for file_name, text in (startup_extra or {}).items():
        write_atomic(startup / file_name, text, PUBLIC)
    if local:
        (dest / "local").mkdir()
        write_local(dest, local, kind)
    return issued.cert


def write_startup(startup: Path, ca_pem: bytes, target: Target, *, name: str, org: str,
                  kind: str, role: str | None = None,
                  listen: tuple[str, int] | None = None) -> None:
    """A kit's public startup files beside its certificate and key: rootCA.pem, kit.yaml and
    its cache kit.json."""
    write_atomic(startup / CA_FILE, ca_pem, PUBLIC)
    kit_yaml = render_kit_yaml(
        project=target.project,
        name=name,
        kind=kind,
        org=org,
        role=role,
        server_host=target.server_host,
        server_port=target.server_port,
        listen=listen,
    )
    write_atomic(startup / KIT_FILE, kit_yaml, PUBLIC)
    # Spares every load_kit of this kit the YAML parse, until kit.yaml is edited (kit.py).
    write_atomic(startup / KIT_CACHE_FILE, render_kit_json(kit_yaml), PUBLIC)


def write_local(dest: Path, local: dict[str, str], kind: str) -> None:
    """The operator's ``local/`` templates, into the existing ``dest/local``."""
    for file_name, text in local.items():
        write_atomic(dest / "local" / file_name, text, PUBLIC)


def site_local_files(studies: list[str], default_study: bool = True) -> dict[str, str]:
    return {"site.yaml": site_yaml("site"),
            "study_runtime.yaml": study_runtime_yaml(studies, default_study),
            "authorization.json": authorization_json()}


def target_of(state: dict[str, Any]) -> Target:
    """Where the kits of a provisioned project (its ``ca/state.json``) dial."""
    server = state["server"]
    return Target(state["project"], server["host"], server["port"])


def provision(project: Project, out_dir: Path, *, force: bool = False) -> ProvisionResult:
    """Write ``out_dir/<project.name>/``; refuse to replace an existing one unless ``force``."""
    out_dir = Path(out_dir).expanduser().resolve()
    final = out_dir / project.name
    if final.exists() and not force:
        raise ProvisionError(
            f"{final} already exists; pass --force to replace it (a new CA: every kit of the "
            "project must then be sent again), or use `atoll provision add-site|add-user`"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{project.name}.tmp-", dir=out_dir))
    try:
        kits = _write_project(project, tmp)
        _swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    kits = [WrittenKit(k.name, k.kind, k.org, k.role, final / k.path.name) for k in kits]
    return ProvisionResult(project_dir=final, ca_dir=final / "ca", kits=kits)


def _write_project(project: Project, root: Path) -> list[WrittenKit]:
    server = project.server
    target = Target(project.name, server.host, server.port)
    ca = create_ca(project.name)
    save_ca(ca, root / "ca")
    participants: dict[str, dict[str, Any]] = {}
    kits: list[WrittenKit] = []
    project_json = json.dumps(project.model_dump(mode="json"), indent=2) + "\n"
    listen = (server.listen.host or "", server.listen.port or server.port)
    cert = _write_kit(
        root / SERVER_DIR,
        ca,
        target,
        name=server.name,
        org=project.name,
        kind="server",
        listen=listen,
        startup_extra={PROJECT_FILE: project_json},
        local={"site.yaml": site_yaml("server")},
    )
    participants[server.name] = record(cert, "server", project.name, None, SERVER_DIR)
    kits.append(WrittenKit(server.name, "server", project.name, None, root / SERVER_DIR))
    for site in project.sites:
        local = site_local_files(project.studies_of(site.name), not project.studies)
        cert = _write_kit(
            root / site.name, ca, target, name=site.name, org=site.org, kind="site", local=local
        )
        participants[site.name] = record(cert, "site", site.org, None, site.name)
        kits.append(WrittenKit(site.name, "site", site.org, None, root / site.name))
    for user in project.users:
        cert = _write_kit(
            root / user.name, ca, target, name=user.name, org=user.org, kind="admin", role=user.role
        )
        participants[user.name] = record(cert, "admin", user.org, user.role, user.name)
        kits.append(WrittenKit(user.name, "admin", user.org, user.role, root / user.name))
    state = {
        "format_version": STATE_VERSION,
        "project": project.name,
        "server": {"name": server.name, "host": server.host, "port": server.port},
        "ca": {
            "serial": format(ca.cert.serial_number, "x"),
            "not_after": ca.cert.not_valid_after_utc.isoformat(),
        },
        "participants": participants,
    }
    write_state(root / "ca", state)
    root.chmod(0o700)  # the folder holds every private key of the project
    return kits


def _swap_into_place(tmp: Path, final: Path) -> None:
    if not final.exists():
        tmp.rename(final)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    old.rmdir()
    final.rename(old)
    try:
        tmp.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def add_site(project_dir: Path, name: str, org: str) -> WrittenKit:
    """Sign a new site with the project's CA and write only its kit."""
    checks = identity_checks(name, org, None)
    return _add(Path(project_dir), name, org, "site", None, checks, site_local_files([]))


def add_user(project_dir: Path, name: str, org: str, role: str) -> WrittenKit:
    """Sign a new admin user with the project's CA and write only its kit."""
    checks = identity_checks(name, org, role)
    return _add(Path(project_dir), name, org, "admin", role, checks, None)


def _add(
    project_dir: Path,
    name: str,
    org: str,
    kind: Kind,
    role: str | None,
    checks: list[tuple[str, Any, Any]],
    local: dict[str, str] | None,
) -> WrittenKit:
    project_dir = project_dir.expanduser().resolve()
    with locked(project_dir) as state:
        check_new(project_dir, state, name, checks)
        ca = load_ca(project_dir / "ca")
        target = target_of(state)
        dest = project_dir / name
        tmp = project_dir / f".{name}.tmp-{os.getpid()}"  # unique: we hold the lock
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            cert = _write_kit(
                tmp, ca, target, name=name, org=org, kind=kind, role=role, local=local
            )
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            add_entry(state, name, record(cert, kind, org, role, name))
            write_state(project_dir / "ca", state)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    return WrittenKit(name, kind, org, role, dest)
