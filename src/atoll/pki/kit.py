"""Startup kits: what one participant needs to join the federation, and how it is read back.

A kit folder ``<kit>/`` holds ``startup/`` (written by ``atoll provision``, not to be edited:
certificate, private key 0600, root CA, ``kit.yaml``) and, for the server and sites, ``local/``
(the operator's own ``site.yaml`` and ``study_runtime.yaml``).

``kit.yaml``::

    project: pathology-consortium
    name: hospital-a
    kind: site                       # server | site | admin
    org: hospital-a
    role: lead                       # admins only
    server: {host: fl.example.org, port: 8443}
    listen: {host: 0.0.0.0, port: 8443}   # server only
    workspace: workspace             # server and sites; relative to the kit folder

``load_kit`` is on every CLI call's path, so it reads YAML and checks files, nothing heavier.
PyYAML is imported only by the functions that use it: a parent reads its kit in a forked child
(atoll.forked) and keeps the ``Kit``, not PyYAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_WORKSPACE = "workspace"  # kit.yaml's `workspace`, relative to the kit folder

KIT_FILE = "kit.yaml"
CA_FILE = "rootCA.pem"
PROJECT_FILE = "project.json"  # server kit only: the validated project it seeds its store from
_KINDS = ("server", "site", "admin")
_PROVISION_HINT = "run `atoll provision PROJECT.yaml --out DIR` and pass DIR/<project>/<name>"


class KitError(ValueError):
    """The folder is not a usable startup kit; the message says which file and what to do."""


def cert_file_names(kind: str) -> tuple[str, str]:
    return ("server.crt", "server.key") if kind == "server" else ("client.crt", "client.key")


@dataclass(frozen=True)
class Kit:
    project: str
    name: str
    kind: str  # server | site | admin
    org: str
    role: str | None  # admins only
    server_host: str
    server_port: int
    kit_dir: Path  # absolute
    workspace: Path  # absolute; where the server or site parent keeps its state
    listen_host: str | None = None  # server only
    listen_port: int | None = None  # server only

    @property
    def startup_dir(self) -> Path:
        return self.kit_dir / "startup"

    @property
    def local_dir(self) -> Path:
        return self.kit_dir / "local"

    @property
    def cert(self) -> Path:
        return self.startup_dir / cert_file_names(self.kind)[0]

    @property
    def key(self) -> Path:
        return self.startup_dir / cert_file_names(self.kind)[1]

    @property
    def ca(self) -> Path:
        return self.startup_dir / CA_FILE

    @property
    def project_json(self) -> Path:
        return self.startup_dir / PROJECT_FILE

    @property
    def server_address(self) -> str:
        return _address(self.server_host, self.server_port)

    @property
    def listen_address(self) -> str:
        if self.listen_host is None or self.listen_port is None:
            raise KitError(f"{self.kit_dir}: only a server kit has a listen address")
        return _address(self.listen_host, self.listen_port)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def render_kit_yaml(
    *,
    project: str,
    name: str,
    kind: str,
    org: str,
    server_host: str,
    server_port: int,
    role: str | None = None,
    listen: tuple[str, int] | None = None,
) -> str:
    import yaml

    doc: dict[str, Any] = {"project": project, "name": name, "kind": kind, "org": org}
    if role is not None:
        doc["role"] = role
    doc["server"] = {"host": server_host, "port": server_port}
    if listen is not None:
        doc["listen"] = {"host": listen[0], "port": listen[1]}
    if kind in ("server", "site"):
        doc["workspace"] = DEFAULT_WORKSPACE
    header = (
        "# atoll startup kit, written by `atoll provision`. Identity comes from the certificate\n"
        "# next to this file; only `server`, `listen` and `workspace` may be edited here.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def _find_kit_dir(path: Path) -> Path:
    path = path.expanduser().resolve()
    if path.name == KIT_FILE:
        path = path.parent
    if path.name == "startup" and (path / KIT_FILE).is_file():
        return path.parent
    return path


def load_kit(path: str | Path) -> Kit:
    """Read the kit in ``path`` (the kit folder, its ``startup/`` or its ``kit.yaml``)."""
    import yaml

    kit_dir = _find_kit_dir(Path(path))
    kit_file = kit_dir / "startup" / KIT_FILE
    if not kit_dir.is_dir():
        raise KitError(f"not a startup kit: {kit_dir} does not exist; {_PROVISION_HINT}")
    if not kit_file.is_file():
        raise KitError(f"not a startup kit: {kit_file} missing; {_PROVISION_HINT}")
    try:
        doc = yaml.safe_load(kit_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KitError(f"corrupt startup kit: cannot read {kit_file}: {exc}") from None
    if not isinstance(doc, dict):
        raise KitError(f"corrupt startup kit: {kit_file} is not a mapping")
    errors: list[str] = []

    def text(key: str, required: bool = True) -> str | None:
        value = doc.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            errors.append(f"{key}: expected a non-empty string")
            return None
        return value

    def endpoint(key: str) -> tuple[str, int] | None:
        value = doc.get(key)
        if not isinstance(value, dict) or set(value) != {"host", "port"}:
            errors.append(f"{key}: expected {{host: HOST, port: PORT}}")
            return None
        host, port = value["host"], value["port"]
        if not isinstance(host, str) or not host:
            errors.append(f"{key}.host: expected a host name or address")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            errors.append(f"{key}.port: expected a port number 1-65535")
        return (host, port)

    known = {"project", "name", "kind", "org", "role", "server", "listen", "workspace"}
    errors += [f"{key}: unknown key" for key in doc if key not in known]
    project, name, org = text("project"), text("name"), text("org")
    kind = text("kind")
    if kind is not None and kind not in _KINDS:
        errors.append(f"kind: {kind!r} is not one of {', '.join(_KINDS)}")
    role = text("role", required=kind == "admin")
    server = endpoint("server")
    listen = endpoint("listen") if kind == "server" else None
    workspace = text("workspace", required=False) or DEFAULT_WORKSPACE
    if errors:
        lines = "; ".join(errors)
        raise KitError(f"corrupt startup kit {kit_file}: {lines}; re-provision this participant")
    assert project and name and org and kind and server
    kit = Kit(
        project=project,
        name=name,
        kind=kind,
        org=org,
        role=role,
        server_host=server[0],
        server_port=server[1],
        kit_dir=kit_dir,
        workspace=(kit_dir / workspace).resolve(),
        listen_host=listen[0] if listen else None,
        listen_port=listen[1] if listen else None,
    )
    needed = [kit.cert, kit.key, kit.ca] + ([kit.project_json] if kind == "server" else [])
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise KitError(f"incomplete startup kit: missing {', '.join(missing)}; {_PROVISION_HINT}")
    return kit
