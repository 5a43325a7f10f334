"""The process launcher's GPU reservations (launchers/process_allocation.py): each id held by
one job at a time, and a job's end frees its own ids only."""

from __future__ import annotations

import pytest

from atoll.launchers.base import LaunchError
from atoll.launchers.process_allocation import GpuAllocator


def test_a_job_ending_frees_its_own_gpus_only():
    gpus = GpuAllocator(["0", "1", "2"])
    assert gpus.allocate("j1", 1) == ["0"]
    assert gpus.allocate("j2", 2) == ["1", "2"]
    gpus.release("j1")
    assert gpus.in_use() == {"1": "j2", "2": "j2"}
    with pytest.raises(LaunchError, match="only 1 of this site's 3 are free"):
        gpus.allocate("j3", 2)  # j2 still holds two
    assert gpus.allocate("j3", 1) == ["0"]
