"""What the backend scripts (`scripts/backends/<name>.sh up`) leave for the tests to read."""

from __future__ import annotations

import os
from pathlib import Path


def read_env_file(base_var: str, default_base: str) -> dict[str, str]:
    """The KEY=VALUE lines of `<base>/env`, base from $base_var or its default."""
    base = Path(os.environ.get(base_var, default_base))
    env: dict[str, str] = {}
    for line in (base / "env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key.strip()] = value.strip()
    return env
