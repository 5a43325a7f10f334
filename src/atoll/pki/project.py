"""``project.yaml``: the participants of one federation, validated before anything is signed.

The file is owned by the project admin. Validation runs in two passes over the same document and
reports every problem at once, each with its YAML path (``sites[1].name: ...``):

1. structure (pydantic, ``extra="forbid"``, strict types, name rules per field);
2. cross references on the raw document, so they are reported even when pass 1 failed:
   names unique across server, sites and users; study names; study sites and admins provisioned.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from atoll.pki.identity import ROLES
from atoll.spec.errors import Issue, SpecError, describe, issues_from_validation_error
from atoll.spec.names import LOOPBACK_NAMES, is_loopback

Role = Literal["project_admin", "org_admin", "lead", "member"]  # == identity.ROLES (tested)

# RFC 1123 label: site names become Kubernetes label values, folder names and certificate CNs.
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
STUDY_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$")
_USER = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$"
)
_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# "server" names the server in deploy maps; "ca" is the CA's folder next to the kits.
RESERVED_SITE_NAMES = frozenset({"server", "ca"})
RESERVED_STUDY_NAMES = frozenset({"default"})


class ProjectError(SpecError):
    """project.yaml (or an add-site / add-user request) is invalid; ``issues`` lists every one."""


def check_site_name(value: str) -> str:
    if not _LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid site name: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (it becomes a folder name and a "
            "Kubernetes label value)"
        )
    if value in RESERVED_SITE_NAMES:
        raise ValueError(f"{value!r} is reserved; choose another site name")
    return value


def check_user_name(value: str) -> str:
    if len(value) > 254 or not _USER.match(value):
        raise ValueError(f"{value!r} is not a valid user name: use an email address")
    return value


def check_org(value: str) -> str:
    if not value or value != value.strip() or len(value) > 64:
        raise ValueError(f"{value!r} is not a valid org: 1-64 characters, no surrounding spaces")
    if any(ord(ch) < 32 or ch in "/\\" for ch in value):
        raise ValueError(f"{value!r} is not a valid org: no control characters or slashes")
    return value


def check_role(value: str) -> str:
    if value not in ROLES:
        raise ValueError(f"{value!r} is not a role; use one of: {', '.join(ROLES)}")
    return value


def _check_project_name(value: str) -> str:
    if not STUDY_NAME.match(value):
        raise ValueError(
            f"{value!r} is not a valid project name: 1-63 lowercase letters, digits, '-' and '_', "
            "starting and ending with a letter or digit (it becomes a folder name)"
        )
    return value


def _check_server_name(value: str) -> str:
    if not _LABEL.match(value) or value == "ca":
        raise ValueError(
            f"{value!r} is not a valid server name: 1-63 lowercase letters, digits and '-'"
        )
    return value


def default_listen_host(host: str) -> str:
    """Where a server dialled at ``host`` binds when project.yaml does not say: a loopback
    address itself (127.0.0.2 is not reached on 127.0.0.1), 127.0.0.1 for a loopback name,
    else every interface."""
    if not is_loopback(host):
        return "0.0.0.0"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return "127.0.0.1"


def check_host(value: str) -> str:
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        labels = value.rstrip(".").split(".")
        if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
            raise ValueError(f"{value!r} is not a host name or IP address") from None
        return value
    if ip.is_unspecified:
        raise ValueError(f"{value!r} cannot be dialled; give the address sites connect to")
    return value


def _check_listen_host(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if value not in LOOPBACK_NAMES:
            raise ValueError(
                f"{value!r} is not an IP address to listen on (e.g. 0.0.0.0, 127.0.0.1, ::)"
            ) from None
    return value


ProjectName = Annotated[str, AfterValidator(_check_project_name)]
ServerName = Annotated[str, AfterValidator(_check_server_name)]
SiteName = Annotated[str, AfterValidator(check_site_name)]
UserName = Annotated[str, AfterValidator(check_user_name)]
Org = Annotated[str, AfterValidator(check_org)]
Host = Annotated[str, AfterValidator(check_host)]
ListenHost = Annotated[str, AfterValidator(_check_listen_host)]
Port = Annotated[int, Field(ge=1, le=65535)]

_STRICT = ConfigDict(extra="forbid", strict=True)


class ListenSpec(BaseModel):
    model_config = _STRICT
    host: ListenHost | None = Field(
        None,
        description="Address the server binds. Default: a loopback address itself when "
        "`server.host` is one, 127.0.0.1 for `localhost`, else 0.0.0.0 (all interfaces).",
    )
    port: Port | None = Field(None, description="Port the server binds. Default: `server.port`.")


class ServerSpec(BaseModel):
    model_config = _STRICT
    name: ServerName = Field("server", description="The server's certificate common name.")
    host: Host = Field(description="Host name or IP address sites and admins dial.")
    port: Port = Field(description="TLS port sites and admins dial.")
    listen: ListenSpec = Field(
        default_factory=ListenSpec, description="Where the server binds, when not host:port."
    )

    @model_validator(mode="after")
    def _resolve_listen(self) -> ServerSpec:
        host = self.listen.host or default_listen_host(self.host)
        self.listen = ListenSpec(host=host, port=self.listen.port or self.port)
        return self


class SiteSpec(BaseModel):
    model_config = _STRICT
    name: SiteName = Field(description="Site name: RFC 1123 label, unique in the project.")
    org: Org = Field(description="Organization the site belongs to.")


class UserSpec(BaseModel):
    model_config = _STRICT
    name: UserName = Field(description="User name: an email address, unique in the project.")
    org: Org = Field(description="Organization the user belongs to.")
    role: Role = Field(description="project_admin, org_admin, lead or member.")


class StudySpec(BaseModel):
    model_config = _STRICT
    sites: list[str] = Field(default_factory=list, description="Provisioned sites in the study.")
    admins: list[str] = Field(default_factory=list, description="Provisioned users of the study.")


class Project(BaseModel):
    model_config = _STRICT
    name: ProjectName = Field(description="Project name; the output folder is named after it.")
    server: ServerSpec = Field(description="The federation server.")
    sites: list[SiteSpec] = Field(default_factory=list, description="Sites to provision.")
    users: list[UserSpec] = Field(default_factory=list, description="Admin users to provision.")
    studies: dict[str, StudySpec] = Field(
        default_factory=dict, description="Studies seeded into the server's registry."
    )

    def studies_of(self, site: str) -> list[str]:
        return [name for name, study in self.studies.items() if site in study.sites]


def _named(items: Any, section: str) -> list[tuple[str, str]]:
    """(path, name) of every entry of a raw list section that has a string name."""
    if not isinstance(items, list):
        return []
    return [
        (f"{section}[{i}].name", item["name"])
        for i, item in enumerate(items)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]


def _cross_check(raw: dict[str, Any]) -> list[Issue]:
    errors: list[Issue] = []
    named = _named(raw.get("sites"), "sites") + _named(raw.get("users"), "users")
    server = raw.get("server")
    if isinstance(server, dict):
        name = server.get("name", "server")
        if isinstance(name, str):
            named.insert(0, ("server.name", name))
    seen: dict[str, str] = {}
    for path, name in named:
        if path.startswith("sites[") and name in RESERVED_SITE_NAMES:
            continue  # already reported as reserved by the structural pass
        first = seen.setdefault(name.lower(), path)
        if first != path:
            errors.append(Issue(path, f"{name!r} is already used by {first}; names must be unique"))
    sites = {name for path, name in named if path.startswith("sites[")}
    users = {name for path, name in named if path.startswith("users[")}
    studies = raw.get("studies")
    if not isinstance(studies, dict):
        return errors
    for study, body in studies.items():
        where = f"studies.{study}"
        if not isinstance(study, str) or not STUDY_NAME.match(study):
            message = (
                f"{study!r} is not a valid study name: 1-63 lowercase letters, digits, "
                "'-' and '_', starting and ending with a letter or digit"
            )
            errors.append(Issue(where, message))
        elif study in RESERVED_STUDY_NAMES:
            errors.append(Issue(where, f"{study!r} is reserved; choose another study name"))
        if not isinstance(body, dict):
            continue
        for key, known, what in (("sites", sites, "site"), ("admins", users, "user")):
            members = body.get(key)
            if not isinstance(members, list):
                continue
            listed: set[str] = set()
            for i, member in enumerate(members):
                if not isinstance(member, str):
                    continue
                path = f"{where}.{key}[{i}]"
                if member in listed:
                    errors.append(Issue(path, f"{member!r} is listed twice"))
                elif member not in known:
                    section = "sites" if what == "site" else "users"
                    message = f"{member!r} is not a provisioned {what}; add it to `{section}` first"
                    errors.append(Issue(path, message))
                listed.add(member)
    return errors


_SECTIONS = ("name", "server", "sites", "users", "studies")
_PATH_HEAD = re.compile(r"^([^.\[:]+)(?:\[(\d+)\]|\.([^.\[:]+))?")


def _document_order(raw: dict[str, Any], issue: Issue) -> tuple[int, int]:
    """Sort key placing errors in the order of the document (section, then entry)."""
    match = _PATH_HEAD.match(issue.path)
    if match is None:
        return (-1, 0)
    section, index, key = match.groups()
    rank = _SECTIONS.index(section) if section in _SECTIONS else len(_SECTIONS)
    if index is not None:
        return (rank, int(index))
    studies = raw.get("studies")
    if section == "studies" and isinstance(studies, dict) and key in studies:
        return (rank, list(studies).index(key))
    return (rank, 0)


def parse_project(raw: Any, source: str = "project.yaml") -> Project:
    """Validate a parsed project document; raise ProjectError listing every problem."""
    if not isinstance(raw, dict):
        message = (
            f"expected a mapping with name, server, sites, users, studies; got {describe(raw)}"
        )
        raise ProjectError([Issue("", message)], source)
    project: Project | None = None
    try:
        project = Project.model_validate(raw)
        errors: list[Issue] = []
    except ValidationError as exc:
        errors = issues_from_validation_error(exc, Project)
    errors += _cross_check(raw)
    errors.sort(key=lambda issue: _document_order(raw, issue))
    if errors or project is None:
        raise ProjectError(errors, source)
    return project


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a duplicated study must be an error."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            line = key_node.start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {line})", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_project(path: str | Path) -> Project:
    """Read and validate ``project.yaml``; raise ProjectError naming every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProjectError(
            [Issue("", f"cannot read the file: {exc.strerror}")], str(path)
        ) from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ProjectError([Issue("", f"not valid YAML: {exc}")], str(path)) from None
    return parse_project(raw, str(path))
