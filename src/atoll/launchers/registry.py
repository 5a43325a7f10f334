"""The built-in launchers, imported only when a site chooses one (their SDKs are optional)."""

from __future__ import annotations

import importlib
from typing import Any

from atoll.launchers.base import Launcher

LAUNCHERS: dict[str, str] = {
    "process": "atoll.launchers.process:ProcessLauncher",
    "docker": "atoll.launchers.docker:DockerLauncher",
    "k8s": "atoll.launchers.kubernetes:KubernetesLauncher",
    "slurm": "atoll.launchers.slurm:SlurmLauncher",
}


def launcher_class(name: str) -> type[Launcher]:
    """The class for a launcher name; ValueError names the known ones."""
    try:
        module_name, _, attr = LAUNCHERS[name].partition(":")
    except KeyError:
        raise ValueError(
            f"unknown launcher {name!r}; choose one of {', '.join(LAUNCHERS)}"
        ) from None
    return getattr(importlib.import_module(module_name), attr)


def get_launcher(name: str, site_config: Any, **clients: Any) -> Launcher:
    """A launcher for this site; ``clients`` are injected backend clients (tests, fakes)."""
    return launcher_class(name)(site_config, **clients)
