"""``ParserPool``: one worker process that parses big request bodies, so that neither the event loop nor the API
process's GIL waits on them (``json.loads`` of 10 MB holds the GIL for tens to hundreds of ms, in a thread too)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies, even by SIGKILL (no orphan keeps running)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ParserPool:
    """Started at its first use; a worker that died is replaced at the next call."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None

    async def run(self, fn, *args):
        """``fn(*args)`` in the worker process (``fn`` and its arguments and result must pickle)."""
        if self.pool is None:
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=die_with_parent)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        except BrokenProcessPool:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
