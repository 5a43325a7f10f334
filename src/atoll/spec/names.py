"""Name rules shared by the contracts: targets, studies, datasets, environment variables."""

from __future__ import annotations

import re

# Sites and studies become parts of Kubernetes names, Slurm job names and paths: keep them tame.
SITE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# RFC 1123 label: what Kubernetes accepts as a volume or object name part.
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# RFC 1123 subdomain: Kubernetes Secret and PVC names.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # POSIX, as NVIDIA FLARE 2.9 takes on Slurm

_SITE_RE = re.compile(SITE_NAME_PATTERN)
_LABEL_RE = re.compile(LABEL_PATTERN)
_SUBDOMAIN_RE = re.compile(SUBDOMAIN_PATTERN)
_ENV_RE = re.compile(ENV_NAME_PATTERN)

SERVER = "server"
ALL_SITES = "@ALL"


def is_site_name(name: object) -> bool:
    return isinstance(name, str) and _SITE_RE.fullmatch(name) is not None


def is_label(name: object) -> bool:
    return isinstance(name, str) and _LABEL_RE.fullmatch(name) is not None


def is_subdomain(name: object) -> bool:
    return isinstance(name, str) and len(name) <= 253 and _SUBDOMAIN_RE.fullmatch(name) is not None


def is_env_name(name: object) -> bool:
    return isinstance(name, str) and _ENV_RE.fullmatch(name) is not None


def check_label(name: str) -> str:
    if not is_label(name):
        raise ValueError(
            f"{name!r} is not a valid name; use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def check_env_name(name: str) -> str:
    if not is_env_name(name):
        raise ValueError(
            f"{name!r} is not a valid environment variable name; use letters, digits and "
            "'_', not starting with a digit"
        )
    return name


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """A host name or address that never leaves this machine (``localhost``, 127.0.0.0/8, ::1)."""
    import ipaddress

    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def address_host(address: str) -> str:
    """``"127.0.0.1:7001"`` -> ``127.0.0.1``; ``"[::1]:7001"`` -> ``::1``."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
