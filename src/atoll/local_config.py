"""A parent's own ``local/`` files, checked at start without keeping pydantic in the parent.

Validating ``site.yaml`` (and a site's ``study_runtime.yaml``) needs pydantic and the spec
models: about 13 MiB that would stay in a long-lived parent for good. At rest a parent needs
only a few plain values: its launcher's name, its capacity and its worker endpoint. So at start,
while the parent still runs one thread, the files are validated in a forked child, which sends
back those values and the validated ``SiteConfig``, pickled. The parent unpickles the model, and
makes its launcher, when a job first needs them; only then is pydantic imported.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.forked import Forked, start_forked

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher
    from atoll.spec.site_config import SiteConfig

@dataclass(frozen=True)
class Endpoint:
    """Where the parent listens for its own workers (site.yaml's worker_endpoint, resolved)."""

    host: str
    port: int
    dial_host: str
    uses_tls: bool


@dataclass(frozen=True)
class Checked:
    """What the check sends back to the parent."""

    launcher: str
    capacity: dict[str, Any]
    endpoint: Endpoint
    site_config: bytes  # the validated SiteConfig, pickled


class LocalConfig:
    """Plain values at rest; the SiteConfig model and the launcher on first use. The check may
    still be running in its child: the first value asked for waits for it (and raises its
    SpecError)."""

    def __init__(self, checking: Forked[Checked]):
        self._checking = checking
        self._site_config: SiteConfig | None = None
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()

    def _checked(self) -> Checked:
        return self._checking.result()

    @property
    def launcher_name(self) -> str:
        return self._checked().launcher

    @property
    def capacity(self) -> dict[str, Any]:
        return self._checked().capacity

    @property
    def endpoint(self) -> Endpoint:
        return self._checked().endpoint

    @property
    def site_config(self) -> SiteConfig:
        with self._lock:
            if self._site_config is None:
                self._site_config = pickle.loads(self._checked().site_config)
            return self._site_config

    @property
    def launcher(self) -> Launcher:
        config = self.site_config
        with self._lock:
            if self._launcher is None:
                from atoll.launchers.registry import get_launcher

                self._launcher = get_launcher(self.launcher_name, config)
            return self._launcher

    def close(self) -> None:
        with self._lock:
            launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.close()


def load_local_config(local_dir: Path, study_runtime: bool) -> LocalConfig:
    """Start validating ``local_dir``'s site.yaml (and study_runtime.yaml) in a forked child.

    Call it before this process starts threads (gRPC's among them): then the check runs while
    the parent goes on importing and starting up. Values wait for it; SpecError lists problems.
    """
    return LocalConfig(start_forked(_check, local_dir, study_runtime))


def _check(local_dir: Path, study_runtime: bool) -> Checked:
    from atoll.spec.site_config import load_site_config
    from atoll.spec.study_runtime import load_study_runtime

    config = load_site_config(local_dir / "site.yaml")
    if study_runtime:
        load_study_runtime(local_dir, config.launcher)
    cap, ep = config.capacity, config.worker_endpoint
    return Checked(config.launcher, {"gpus": cap.gpus, "cpus": cap.cpus, "memory": cap.memory},
                   Endpoint(ep.host, ep.port, ep.dial_host, ep.uses_tls), pickle.dumps(config))
