"""The server parent's heap and Python's cycle collector.

A server parent keeps a few hundred objects per connected site for as long as the site stays
(its link, its calls, what waits on them). Python's full collection walks every tracked object,
and it runs whenever the objects that outlived the younger collections grew by a quarter of
those already old. A round's waiting reads and replies outlive them, so at 10,000 sites full
collections ran 30 times in a four-round job, about a second each: 25 s, a quarter of the
server's CPU while the rounds ran (`bench/scale`, issue 40; BENCHMARKS.md).

So the parent freezes its heap every FREEZE_S (`gc.freeze`: what is alive then is out of the
collector's sight, and full collections walk only what came since) and thaws it every THAW_S,
collecting once (`gc.unfreeze`, `gc.collect`): cycles that became garbage while frozen wait at
most that long. Everything else is freed by its reference count, frozen or not.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

FREEZE_S = 10.0
THAW_S = 600.0


class HeapKeeper:
    def __init__(self, freeze_s: float = FREEZE_S, thaw_s: float = THAW_S,
                 clock: Callable[[], float] = time.monotonic):
        self.freeze_s, self.thaw_s, self.clock = freeze_s, thaw_s, clock
        self._thawed_at = clock()

    def tick(self) -> None:
        now = self.clock()
        if now - self._thawed_at < self.thaw_s:
            gc.freeze()
            return
        gc.unfreeze()
        gc.collect()
        self._thawed_at = now

    def run(self, stopped: threading.Event) -> None:
        """Until `stopped` is set (a thread of its own: the parent's housekeeping); then thawed,
        for whatever the process does next (a test run, the parent's exit)."""
        while not stopped.wait(self.freeze_s):
            self.tick()
        gc.unfreeze()
