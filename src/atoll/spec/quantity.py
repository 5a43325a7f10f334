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


# --- native spellings a job may use in launcher_spec (NVIDIA FLARE 2.9 accepts them) ----------
_DOCKER_SIZE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([bB]|[kKmMgG][bB]?)?$")
_DOCKER_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
DOCKER_MAX_BYTES = (1 << 63) - 1
DOCKER_SIZE_HINT = (
    "write bytes as an integer, a Docker size such as 512m, 8g or 1.5g, or 2Gi"
)


def docker_size_to_bytes(value: object) -> int:
    """A Docker byte size (``shm_size``): an integer of bytes, ``"8g"``, ``"512m"``, ``"1.5g"``,
    ``"100b"`` (binary units, as the Docker SDK reads them), or atoll's ``"2Gi"``.

    >>> docker_size_to_bytes("8g"), docker_size_to_bytes("2Gi"), docker_size_to_bytes(1024)
    (8589934592, 2147483648, 1024)
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; {DOCKER_SIZE_HINT}")
    if isinstance(value, int):
        size = value
    elif is_memory(value):
        size = memory_to_bytes(value)  # type: ignore[arg-type]
    elif isinstance(value, str) and (match := _DOCKER_SIZE_RE.fullmatch(value)):
        amount, unit = match.groups()
        size = int(float(amount) * _DOCKER_UNITS[(unit or "b")[0].lower()])
    else:
        raise ValueError(f"{value!r} is not a size; {DOCKER_SIZE_HINT}")
    if size <= 0 or size > DOCKER_MAX_BYTES:
        raise ValueError(f"{value!r} must be more than 0 bytes and within Docker's 64-bit limit")
    return size


_K8S_QUANTITY_RE = re.compile(
    r"^(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_K8S_SUFFIX = {
    "": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
K8S_QUANTITY_HINT = 'write a Kubernetes quantity, for example "500m" or "2" (CPU), "8Gi" or "500M"'


def k8s_quantity(value: object) -> str:
    """A Kubernetes resource quantity as the manifest carries it (a number becomes its text).

    >>> k8s_quantity(2), k8s_quantity("500m"), k8s_quantity("1.5Gi")
    ('2', '500m', '1.5Gi')
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a quantity; {K8S_QUANTITY_HINT}")
    text = str(value)
    if not _K8S_QUANTITY_RE.fullmatch(text) or k8s_quantity_value(text) <= 0:
        raise ValueError(f"{text!r} is not a positive quantity; {K8S_QUANTITY_HINT}")
    return text


def k8s_quantity_value(text: str) -> float:
    """The number a quantity stands for (cores or bytes), to compare a request with a limit."""
    match = _K8S_QUANTITY_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity; {K8S_QUANTITY_HINT}")
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return float(match["num"]) * 10 ** int(suffix[1:])
    return float(match["num"]) * _K8S_SUFFIX[suffix]


def slurm_mem_to_mib(value: object) -> int:
    """``mem_per_node``: FLARE's integer of MiB (``32768``) or atoll's ``"32Gi"``.

    >>> slurm_mem_to_mib(32768), slurm_mem_to_mib("32Gi")
    (32768, 32768)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if is_memory(value):
        return memory_to_mib(value)  # type: ignore[arg-type]
    raise ValueError(
        f"{value!r} is not a memory size; give MiB as an integer (32768), or "
        f"{MEMORY_HINT.removeprefix('write ')}"
    )
