"""Keep Python's garbage collector off the objects a server process builds at start-up."""

from __future__ import annotations

import gc
import os

FREEZE_ENV = "SPLITFUSE_GC_FREEZE"  # "0": leave the heap to the collector (to measure what freezing it changes)


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now to the collector's permanent generation.

    A serving process starts with a large heap (the model's modules, the tokenizer, FastAPI's routes) that lives
    until it exits. Python's collector walks all of it at every collection of its oldest generation, and the
    engine loop allocates a few objects per sampled request each step, so such collections come every few seconds
    at a large batch and stall the loop for as long as the walk takes. Frozen objects are still freed by reference
    counting; only cycles among them are never collected. vLLM and SGLang freeze their processes' heaps the same way.
    Nothing is frozen where ``$SPLITFUSE_GC_FREEZE`` is "0".
    """
    if os.environ.get(FREEZE_ENV, "1") == "0":
        return
    gc.collect()
    gc.freeze()


def unfreeze_heap() -> None:
    """Hand the frozen objects back to the collector (a server stopping inside a process that goes on)."""
    gc.unfreeze()
