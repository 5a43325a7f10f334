"""Moving the server: its certificate re-issued by the project's own CA for the new host name.

Sites and users check the server's host name against its certificate's names, which are fixed
when the certificate is signed; a kit whose ``server`` was edited to a name the certificate
lacks fails the TLS handshake. ``move_server`` signs a new server certificate (new key, same
name and CA) whose names are the new host and any others given, and writes the new address into
the server kit's kit.yaml (and its listen address, where it was the default for the old host),
into its project.json, into the project's ``ca/state.json`` (so kits added later dial the new
address), and into every kit still in the project folder that dialled the old address. No kit is
re-sent: elsewhere each site's and user's operator edits ``server:`` in their kit.yaml, and a
running site follows (site/server_channel.py). docs/provisioning.md, "Moving the server".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll.base.files import PUBLIC, write_atomic
from atoll.pki.ca import load_ca
from atoll.pki.certs import LOOPBACK_HOSTS, issue_cert
from atoll.pki.kit import cert_file_names, edit_kit_yaml, load_kit
from atoll.pki.project import ProjectError, check_host, default_listen_host
from atoll.pki.provision import SERVER_DIR
from atoll.pki.state import add_entry, locked, record, write_state
from atoll.spec.errors import Issue


@dataclass(frozen=True)
class MovedServer:
    server_kit: Path
    old: tuple[str, int]
    new: tuple[str, int]
    listen: tuple[str, int]
    names: tuple[str, ...]  # the new certificate's names
    serial: str
    kits_updated: list[Path] = field(default_factory=list)  # other kits in the project folder


def move_server(project_dir: Path, host: str, port: int | None = None,
                also: tuple[str, ...] = ()) -> MovedServer:
    """Re-issue the server certificate of ``project_dir`` for ``host`` (and ``also``) and point
    the project's kits at ``host:port``; ProjectError lists every problem, nothing written."""
    project_dir = Path(project_dir).expanduser().resolve()
    issues = []
    for index, name in enumerate((host, *also)):
        try:
            check_host(name)
        except ValueError as exc:
            issues.append(Issue("host" if index == 0 else "also", str(exc)))
    if port is not None and not 0 < port < 65536:
        issues.append(Issue("port", f"{port} is not a port number 1-65535"))
    if issues:
        raise ProjectError(issues, f"cannot move the server of {project_dir}")
    with locked(project_dir) as state:
        server = state["server"]
        old = (server["host"], int(server["port"]))
        new = (host, port or old[1])
        kit_dir = project_dir / SERVER_DIR
        kit = load_kit(kit_dir)
        ca = load_ca(project_dir / "ca")
        names = tuple(dict.fromkeys((host, *also, *LOOPBACK_HOSTS)))
        issued = issue_cert(ca, server["name"], state["project"], "server",
                            hosts=(host, *also))
        listen = _moved_listen(kit.listen_host or "", kit.listen_port or old[1], old, new)

        cert_name, key_name = cert_file_names("server")
        issued.write(kit.startup_dir / cert_name, kit.startup_dir / key_name)
        edit_kit_yaml(kit_dir, server={"host": new[0], "port": new[1]},
                      listen={"host": listen[0], "port": listen[1]})
        _edit_project_json(kit.project_json, new, listen)
        updated = _point_kits(project_dir, state, old, new)
        server.update(host=new[0], port=new[1])
        previous = state["participants"].get(server["name"], {})
        add_entry(state, server["name"],
                  record(issued.cert, "server", state["project"], None,
                         previous.get("folder", SERVER_DIR)))
        write_state(project_dir / "ca", state)
    return MovedServer(kit_dir, old, new, listen, names, issued.serial_hex, updated)


def _moved_listen(host: str, port: int, old: tuple[str, int],
                  new: tuple[str, int]) -> tuple[str, int]:
    """The server's bind address after a move: what the operator set stays; what followed the
    old address by default follows the new one."""
    if host == default_listen_host(old[0]):
        host = default_listen_host(new[0])
    if port == old[1]:
        port = new[1]
    return host, port


def _edit_project_json(path: Path, new: tuple[str, int], listen: tuple[str, int]) -> None:
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    doc["server"].update(host=new[0], port=new[1], listen={"host": listen[0], "port": listen[1]})
    write_atomic(path, json.dumps(doc, indent=2) + "\n", PUBLIC)


def _point_kits(project_dir: Path, state: dict[str, Any], old: tuple[str, int],
                new: tuple[str, int]) -> list[Path]:
    """The site and user kits still in the project folder that dialled ``old``, edited to dial
    ``new``; a kit whose address was already changed by hand is left as it is."""
    updated = []
    for entry in state["participants"].values():
        folder = entry.get("folder")
        if entry.get("kind") == "server" or not folder or entry.get("revoked"):
            continue
        kit_dir = project_dir / folder
        if not (kit_dir / "startup" / "kit.yaml").is_file():
            continue
        kit = load_kit(kit_dir)
        if (kit.server_host, kit.server_port) == old:
            edit_kit_yaml(kit_dir, server={"host": new[0], "port": new[1]})
            updated.append(kit_dir)
    return updated

