"""The chart and a runner for helm-sdkpy's coroutines (the `helm` fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.integration.k8s.conftest import REPO

CHART = REPO / "deploy" / "helm" / "atoll"


def run(coro: Any) -> Any:
    """helm-sdkpy's actions are coroutines."""
    return asyncio.run(coro)
