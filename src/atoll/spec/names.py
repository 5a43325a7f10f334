"""Name rules shared by the contracts: targets, studies, datasets, environment variables, and
the one strict grammar of each identifier that crosses a trust boundary (job and task ids, site,
study and user names, task names, round numbers, dataset and app names).

A peer's value is checked where it lands, before any use (a path, a script, a name): the
``check_*`` functions return it unchanged or raise IdentifierError naming the field and the
value. None of the grammars admits ``/``, ``\\``, a leading ``.``, whitespace, a control
character or a shell metacharacter, so a checked value is one plain path component and one
shell word."""

from __future__ import annotations

import re

from atoll.spec.errors import EXIT_INVALID, AtollError

# Sites and studies become parts of Kubernetes names, Slurm job names and paths: keep them tame.
SITE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# RFC 1123 label: what Kubernetes accepts as a volume or object name part.
LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# RFC 1123 subdomain: Kubernetes Secret and PVC names.
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # POSIX, as NVIDIA FLARE 2.9 takes on Slurm
# The server's job ids are uuid4().hex (server/jobs.py): 32 lowercase hex digits; a test's or a
# FLARE-era id may be shorter. Never '.', so never '..' and never a hidden or dotted name.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # the relay's are t1, t2...
STUDY_NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$"  # as pki/project.py's
# User certificate CNs: e-mail-like (pki/project.py), at most 254 characters (RFC 5321).
USER_NAME_PATTERN = (r"^[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                     r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$")
# A task's name (its topic: train, validate, statistics, a workflow's own).
TASK_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"
MAX_ROUND = 1_000_000_000
MAX_SHOWN = 80  # characters of a refused value shown in its error

_SITE_RE = re.compile(SITE_NAME_PATTERN)
_LABEL_RE = re.compile(LABEL_PATTERN)
_SUBDOMAIN_RE = re.compile(SUBDOMAIN_PATTERN)
_ENV_RE = re.compile(ENV_NAME_PATTERN)
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)
_TASK_ID_RE = re.compile(TASK_ID_PATTERN)
_STUDY_RE = re.compile(STUDY_NAME_PATTERN)
_USER_RE = re.compile(USER_NAME_PATTERN)
_TASK_NAME_RE = re.compile(TASK_NAME_PATTERN)

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


class IdentifierError(AtollError, ValueError):
    """A value a peer sent is not of its identifier's grammar; the message names the field,
    the value (repr, truncated) and the rule."""

    exit_code = EXIT_INVALID


def shown(value: object) -> str:
    """``repr(value)``, cut to MAX_SHOWN characters: a refusal never echoes a megabyte."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text):,} characters)"


def _checked(value: object, pattern: re.Pattern[str], field: str, kind: str, rule: str,
             max_len: int = 255) -> str:
    if not isinstance(value, str) or len(value) > max_len or pattern.fullmatch(value) is None:
        raise IdentifierError(f"{field} {shown(value)} is not a valid {kind}: {rule}")
    return value


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and _JOB_ID_RE.fullmatch(value) is not None


def check_job_id(value: object, field: str = "job_id") -> str:
    return _checked(value, _JOB_ID_RE, field, "job id",
                    "1-64 letters, digits, '_' and '-', starting with a letter or digit")


def check_task_id(value: object, field: str = "task_id") -> str:
    return _checked(value, _TASK_ID_RE, field, "task id",
                    "1-64 letters, digits, '_' and '-', starting with a letter or digit")


def check_site_name(value: object, field: str = "site") -> str:
    return _checked(value, _SITE_RE, field, "site name",
                    "1-63 letters, digits, '.', '_' and '-', starting with a letter or digit")


def check_study_name(value: object, field: str = "study") -> str:
    return _checked(value, _STUDY_RE, field, "study name",
                    "1-63 lowercase letters, digits, '_' and '-', starting and ending with a "
                    "letter or digit")


def check_user_name(value: object, field: str = "user") -> str:
    return _checked(value, _USER_RE, field, "user name",
                    "an e-mail address of letters, digits and ._%+- (at most 254 characters)",
                    max_len=254)


def check_task_name(value: object, field: str = "topic") -> str:
    return _checked(value, _TASK_NAME_RE, field, "task name",
                    "1-64 letters, digits, '.', '_' and '-', not starting with '.' or '-'")


def check_dataset_name(value: object, field: str = "dataset") -> str:
    return _checked(value, _LABEL_RE, field, "dataset name",
                    "1-63 lowercase letters, digits and '-', starting and ending with a letter "
                    "or digit")


def is_app_name(app: object) -> bool:
    """A folder name of the job: no path, no '..', no control character, at most 255 bytes."""
    return (
        isinstance(app, str)
        and bool(app)
        and "/" not in app
        and "\\" not in app
        and ".." not in app
        and "\0" not in app
        and app != "."
        and not app.startswith(("~", "-"))
        and ":" not in app[:2]
        and app.isprintable()  # no control characters, no lone surrogates
        and len(app.encode()) <= 255  # a folder name's limit on Linux
    )


def check_app_name(value: object, field: str = "app") -> str:
    if not is_app_name(value):
        raise IdentifierError(f"{field} {shown(value)} is not a valid app name: a folder name "
                              "of the job, with no '/', '\\', '..', control character or "
                              "leading '~' or '-', at most 255 bytes")
    return value  # type: ignore[return-value]


def check_round(value: object, field: str = "round", optional: bool = False) -> int | None:
    """A round number: a whole number from 0 to MAX_ROUND (None only where ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ROUND:
        raise IdentifierError(f"{field} {shown(value)} is not a valid round number: a whole "
                              f"number from 0 to {MAX_ROUND:,}")
    return value


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
