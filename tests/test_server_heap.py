"""``engine.server.heap``: a server process's start-up heap is kept off the collector, and handed back."""

from __future__ import annotations

import gc

from engine.server.heap import freeze_startup_heap, unfreeze_heap


def test_the_startup_heap_is_frozen_and_handed_back(monkeypatch):
    kept = [[i] for i in range(1000)]  # objects alive at start-up
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        unfreeze_heap()
    assert gc.get_freeze_count() == 0
    monkeypatch.setenv("SPLITFUSE_GC_FREEZE", "0")
    freeze_startup_heap()
    assert gc.get_freeze_count() == 0
