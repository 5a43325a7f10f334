"""Memory quantities as jobs and sites write them: a positive integer with ``Mi``, ``Gi`` or ``Ti``.

>>> memory_to_bytes("64Gi")
68719476736
>>> memory_to_mib("64Gi")
65536
>>> bytes_to_memory(68719476736)
'64Gi'
"""

from __future__ import annotations

import re

MEMORY_PATTERN = r"^[1-9][0-9]*(Mi|Gi|Ti)$"
_MEMORY_RE = re.compile(MEMORY_PATTERN)
_MIB_PER_UNIT = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
MIB = 1024 * 1024

MEMORY_HINT = "write a positive integer with Mi, Gi or Ti, for example 512Mi or 64Gi"


def is_memory(value: object) -> bool:
    return isinstance(value, str) and _MEMORY_RE.fullmatch(value) is not None


def check_memory(value: str) -> str:
    """Pydantic-friendly check: returns the value, raises ValueError with the fix otherwise."""
    if not is_memory(value):
        raise ValueError(f"{value!r} is not a memory size; {MEMORY_HINT}")
    return value


def memory_to_mib(value: str) -> int:
    """``"64Gi"`` -> 65536. Raises ValueError on anything but the documented format."""
    check_memory(value)
    return int(value[:-2]) * _MIB_PER_UNIT[value[-2:]]


def memory_to_bytes(value: str) -> int:
    """``"64Gi"`` -> 68719476736."""
    return memory_to_mib(value) * MIB


def bytes_to_memory(value: int) -> str:
    """The largest exact unit for a whole number of MiB; rounds up to the next MiB otherwise."""
    mib = max(1, -(-value // MIB))
    for unit, factor in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib % factor == 0:
            return f"{mib // factor}{unit}"
    return f"{mib}Mi"
