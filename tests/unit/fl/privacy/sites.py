"""Sites for privacy tests: the real client runtime (``ClientSession`` with ``SitePrivacy``) in
threads of the simulator's in-memory federation, each training with a plain function."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from atoll.fl.app_config import FedAvgArgs
from atoll.fl.client_runtime import ClientSession, bind, unbind
from atoll.fl.model import Model
from atoll.fl.privacy.secagg.identity import LocalAuthority
from atoll.fl.privacy.site_privacy import SitePrivacy
from atoll.fl.simulator import Federation
from atoll.fl.workflows import run_fedavg
from atoll.spec.privacy import PrivacySettings, SitePrivacyPolicy

Train = Callable[[Model], Model]  # received global model -> the site's result
AUTHORITY = LocalAuthority("tests")  # the sites' certificates (a site parent's, in production)


class Leave(Exception):
    """Raised by a Train function: the site's worker dies before it answers."""


def run_private(
    settings: PrivacySettings | None,
    trainers: dict[str, Train],
    results: Path,
    initial: dict[str, np.ndarray],
    *,
    rounds: int = 2,
    min_clients: int | None = None,
    leave_after_send: dict[str, int] | None = None,  # site -> round: gone once it sent
    policies: dict[str, SitePrivacyPolicy] | None = None,
    federation: Federation | None = None,
) -> tuple[Federation, dict[str, str]]:
    federation = federation or Federation(list(trainers), results)
    errors: dict[str, str] = {}

    def loop(site: str, train: Train) -> None:
        privacy = SitePrivacy(settings or PrivacySettings(), (policies or {}).get(site), site,
                              federation.job_id,
                              identity=AUTHORITY.identity(site, federation.job_id))
        session = ClientSession(federation.site_channel(site), site, privacy=privacy)
        bind(session, thread_only=True)
        try:
            while (model := session.receive()) is not None:
                if session.topic == "validate":
                    session.send(Model(metrics={"accuracy": 1.0}, num_examples=1))
                    continue
                session.send(train(model))
                if (leave_after_send or {}).get(site) == model.round:
                    raise Leave(f"left after sending round {model.round}")
        except Exception as exc:  # noqa: BLE001 - a site's failure is its drop-out
            errors[site] = f"{type(exc).__name__}: {exc}"
            federation.drop(site, f"{site} dropped out: {type(exc).__name__}: {exc}")
        finally:
            unbind(thread_only=True)

    threads = [threading.Thread(target=loop, args=item, daemon=True) for item in trainers.items()]
    for thread in threads:
        thread.start()
    job_args: dict[str, Any] = {"privacy": settings} if settings is not None else {}
    try:
        run_fedavg(federation.server_channel(),
                   FedAvgArgs(num_rounds=rounds, min_clients=min_clients, round_timeout=60),
                   Model(params={k: v.copy() for k, v in initial.items()}), job_args)
    finally:
        federation.close()
        for thread in threads:
            thread.join(timeout=30)
    return federation, errors


def adds(delta: dict[str, np.ndarray], n: int) -> Train:
    """A site whose training adds ``delta`` to the global model, from ``n`` examples."""

    def train(model: Model) -> Model:
        return Model(params={k: v + delta[k] for k, v in model.params.items()}, num_examples=n,
                     metrics={"loss": 0.5})

    return train
