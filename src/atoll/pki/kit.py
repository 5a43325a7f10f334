"""Startup kits: what one participant needs to join the federation, and how it is read back.

A kit folder ``<kit>/`` holds ``startup/`` (written by ``atoll provision``, not to be edited:
certificate, private key 0600, root CA, ``kit.yaml``, ``kit.json``) and, for the server and
sites, ``local/`` (the operator's own ``site.yaml`` and ``study_runtime.yaml``).

``kit.yaml``::

    project: pathology-consortium
    name: hospital-a
    kind: site                       # server | site | admin
    org: hospital-a
    role: lead                       # admins only
    server: {host: fl.example.org, port: 8443}
    listen: {host: 0.0.0.0, port: 8443}   # server only
    workspace: workspace             # server and sites; relative to the kit folder

``load_kit`` is on every CLI call's path and every parent's start, so it checks files and
parses as little as it can. ``kit.json`` is provision's cache of kit.yaml: its document and the
text of kit.yaml. While kit.yaml is as provision wrote it, the document comes from
kit.json and PyYAML (~25 ms of import) is never loaded; a kit.yaml edited since, or a kit.json
missing, corrupt or foreign, is parsed as YAML. Both documents pass the same checks. A parent
reads its kit in its own process only when no YAML is needed (``load_kit_without_yaml``), else
in a forked child (atoll.parent.forked), and keeps the ``Kit``, not PyYAML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atoll.spec.errors import EXIT_INVALID, AtollError

DEFAULT_WORKSPACE = "workspace"  # kit.yaml's `workspace`, relative to the kit folder

KIT_FILE = "kit.yaml"
KIT_CACHE_FILE = "kit.json"  # {"kit_yaml": kit.yaml's text, "doc": its document}
CA_FILE = "rootCA.pem"
PROJECT_FILE = "project.json"  # server kit only: the validated project it seeds its store from
_KINDS = ("server", "site", "admin")
_PROVISION_HINT = "run `atoll provision PROJECT.yaml --out DIR` and pass DIR/<project>/<name>"


class KitError(AtollError, ValueError):
    """The folder is not a usable startup kit; the message says which file and what to do."""

    exit_code = EXIT_INVALID


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


_KIT_HEADER = (
    "# atoll startup kit, written by `atoll provision`. Identity comes from the certificate\n"
    "# next to this file; only `server`, `listen` and `workspace` may be edited here.\n"
)


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
    return _KIT_HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def edit_kit_yaml(kit_dir: Path, **changes: Any) -> None:
    """Set top-level keys of ``kit_dir``'s kit.yaml (e.g. ``server``), keeping the others, and
    write its kit.json again so that load_kit keeps sparing the YAML parse."""
    import yaml

    from atoll.base.files import PUBLIC, write_atomic

    kit_file = kit_dir / "startup" / KIT_FILE
    doc = _parse_yaml(kit_file, kit_file.read_bytes())
    if not isinstance(doc, dict):
        raise KitError(f"corrupt startup kit: {kit_file} is not a mapping")
    doc.update(changes)
    text = _KIT_HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
    write_atomic(kit_file, text, PUBLIC)
    write_atomic(kit_file.with_name(KIT_CACHE_FILE), render_kit_json(text), PUBLIC)


def render_kit_json(kit_yaml: str) -> str:
    """The kit.json of a kit.yaml written as ``kit_yaml`` (UTF-8, as write_atomic writes it)."""
    import yaml

    # The document is what kit.yaml parses to, so either path of load_kit sees the same one.
    doc = yaml.safe_load(kit_yaml)
    cache = {"kit_yaml": kit_yaml, "doc": doc}
    return json.dumps(cache, indent=2) + "\n"



def _find_kit_dir(path: Path) -> Path:
    path = path.expanduser().resolve()
    if path.name == KIT_FILE:
        path = path.parent
    if path.name == "startup" and (path / KIT_FILE).is_file():
        return path.parent
    return path


def load_kit(path: str | Path) -> Kit:
    """Read the kit in ``path`` (the kit folder, its ``startup/`` or its ``kit.yaml``)."""
    kit_dir, kit_file, data = _read_kit_file(Path(path))
    doc = _cached_doc(kit_file, data)
    if doc is None:
        doc = _parse_yaml(kit_file, data)
    return _checked_kit(kit_dir, kit_file, doc)


def load_kit_without_yaml(path: str | Path) -> Kit | None:
    """``load_kit`` where kit.json spares the YAML parse; None where only PyYAML can read it.

    Errors are load_kit's. A parent calls this in its own process and, on None, runs load_kit
    in a forked child: one read of the files decides, so PyYAML never loads in the parent.
    """
    kit_dir, kit_file, data = _read_kit_file(Path(path))
    doc = _cached_doc(kit_file, data)
    return None if doc is None else _checked_kit(kit_dir, kit_file, doc)


def _read_kit_file(path: Path) -> tuple[Path, Path, bytes]:
    kit_dir = _find_kit_dir(path)
    kit_file = kit_dir / "startup" / KIT_FILE
    if not kit_dir.is_dir():
        raise KitError(f"not a startup kit: {kit_dir} does not exist; {_PROVISION_HINT}")
    if not kit_file.is_file():
        raise KitError(f"not a startup kit: {kit_file} missing; {_PROVISION_HINT}")
    try:
        return kit_dir, kit_file, kit_file.read_bytes()
    except OSError as exc:
        raise KitError(f"corrupt startup kit: cannot read {kit_file}: {exc}") from None


def _cached_doc(kit_file: Path, data: bytes) -> dict[str, Any] | None:
    """kit.json's document if it was written for exactly these kit.yaml bytes, else None.

    Whatever is wrong with kit.json only sends load_kit back to the YAML: it is a cache.
    """
    try:
        cache = json.loads(kit_file.with_name(KIT_CACHE_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):  # missing, unreadable, not JSON, too deep
        return None
    # The whole text, not a digest: it is a few hundred bytes, and hashlib would load OpenSSL
    # into every CLI call.
    if not isinstance(cache, dict) or cache.get("kit_yaml") != data.decode("utf-8", "replace"):
        return None
    doc = cache.get("doc")
    return doc if isinstance(doc, dict) else None


def _parse_yaml(kit_file: Path, data: bytes) -> Any:
    import yaml

    try:
        return yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise KitError(f"corrupt startup kit: cannot read {kit_file}: {exc}") from None


def _checked_kit(kit_dir: Path, kit_file: Path, doc: Any) -> Kit:
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
