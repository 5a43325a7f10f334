"""The server parent's heap keeper (server/heap.py): it freezes the heap so that full
collections walk only what is new, and thaws it on schedule so that no cycle that died while
frozen stays for longer."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from atoll.server.heap import HeapKeeper


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def _thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_tick_freezes_what_is_alive_and_a_thaw_frees_the_cycles_that_died_since():
    clock = Clock()
    keeper = HeapKeeper(freeze_s=10, thaw_s=600, clock=clock)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    keeper.tick()
    assert gc.get_freeze_count() > 0  # out of the full collections' walk
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: not collected yet
    clock.now = 599.0
    keeper.tick()  # still before the thaw: frozen again, with whatever is new
    assert gone() is not None and gc.get_freeze_count() > 0
    clock.now = 600.0
    keeper.tick()
    assert gone() is None  # the thaw collected it
    assert gc.get_freeze_count() == 0
    clock.now = 610.0
    keeper.tick()  # and the next tick freezes again
    assert gc.get_freeze_count() > 0


def test_a_keeper_that_stops_leaves_the_heap_thawed():
    stopped = threading.Event()
    keeper = HeapKeeper(freeze_s=0.01, thaw_s=600)
    runner = threading.Thread(target=keeper.run, args=(stopped,))
    runner.start()
    deadline = time.monotonic() + 5
    while gc.get_freeze_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.get_freeze_count() > 0
    stopped.set()
    runner.join(5)
    assert gc.get_freeze_count() == 0
