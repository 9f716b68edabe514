"""AsyncEngine: an asyncio loop that owns a synchronous ``LLMEngine`` and serves many requests at once.

``engine.step()`` runs in one worker thread; everything else that touches the engine (adding, aborting, reading
stats) runs on the event loop thread while no step is in flight, so the engine never sees two threads at once.
Requests join and leave between any two passes. Each request gets a ``RequestStream`` that yields its new
tokens; a consumer that goes away (client disconnect, cancel) aborts the request, which frees its KV blocks at
once, or right after the pass in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.server.metrics import ServingMetrics


class QueueFull(Exception):
    """The waiting queue is at its bound (answer 429)."""


class EngineDead(Exception):
    """A forward pass raised; the engine serves nothing more (answer 503, /health fails)."""


@dataclass
class StreamOutput:
    """New tokens of one request since the last read; ``finished`` with a ``finish_reason`` at the end."""

    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None


def _unpack(output) -> tuple[object, list[int], bool, str | None]:
    """(request_id, new token ids, finished, finish_reason) of one item of ``LLMEngine.step()``."""
    get = output.get if isinstance(output, dict) else lambda k, d=None: getattr(output, k, d)
    tokens = get("new_token_ids")
    if tokens is None:
        tokens = get("new_tokens", [])
    if isinstance(tokens, int):
        tokens = [tokens]
    return get("request_id"), list(tokens), bool(get("finished", False)), get("finish_reason")


def _queue_time(output) -> float | None:
    """Arrival to first scheduled pass of one ``LLMEngine.step()`` output, when its metrics say."""
    rm = getattr(output, "metrics", None)
    if rm is None or getattr(rm, "first_scheduled_time", None) is None:
        return None
    return rm.first_scheduled_time - rm.arrival_time


def deliver(owner, items, now: float) -> None:
    """Hand (request_id, new token ids, finished, finish_reason, queue time) items to their streams and observe
    the latency metrics; ``owner`` has ``metrics``, ``_streams`` and ``_timing`` (in-thread or engine-process
    loop alike)."""
    m = owner.metrics
    for request_id, tokens, finished, reason, queue_time in items:
        stream = owner._streams.get(request_id)
        if stream is None:  # aborted while the pass ran
            continue
        timing = owner._timing[request_id]
        if tokens:
            m.generation_tokens.inc(len(tokens))
            if timing.last_token is None:
                m.ttft.observe(now - timing.arrival)
                if queue_time is not None:
                    m.queue.observe(queue_time)
            else:
                m.itl.observe(now - timing.last_token)
            timing.last_token = now
        if finished:
            m.e2e.observe(now - timing.arrival)
            m.requests.get(reason, m.requests["stop"]).inc()
            del owner._streams[request_id], owner._timing[request_id]
        stream.queue.put_nowait(StreamOutput(tokens, finished, reason if finished else None))


class RequestStream:
    """Async iterator over a request's ``StreamOutput``s; each read merges every output queued so far."""

    def __init__(self, request_id, num_prompt_tokens: int) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamOutput:
        if self.finished:
            raise StopAsyncIteration
        merged = StreamOutput()
        item = await self.queue.get()
        while True:
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            merged.token_ids += item.token_ids
            if item.finished:
                merged.finished, merged.finish_reason = True, item.finish_reason
                self.finished = True
                return merged
            if self.queue.empty():
                return merged
            item = self.queue.get_nowait()


def admission_check(frontend, request_id):
    """What every front end checks before queueing a request: a live engine, room in the waiting queue, an unused
    id (one is made when None). Returns the id."""
    if frontend.error is not None:
        raise EngineDead(f"the engine failed and serves no more requests: {frontend.error!r}")
    if frontend.num_waiting >= frontend.max_waiting:
        frontend.metrics.rejected.inc()
        raise QueueFull(f"the waiting queue is full ({frontend.max_waiting} requests); retry later")
    if request_id is None:
        request_id = f"req-{next(frontend._ids)}"
    if request_id in frontend._streams:
        raise ValueError(f"request id {request_id!r} is already in use")
    return request_id


@dataclass
class _Timing:
    arrival: float
    last_token: float | None = None


class AsyncEngine:
    def __init__(self, engine, max_waiting: int = 1024) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = ServingMetrics(self.stats)
        self.error: BaseException | None = None
        self.busy_s = 0.0  # seconds spent in engine.step()
        self._streams: dict[object, RequestStream] = {}
        self._timing: dict[object, _Timing] = {}
        self._ops: list[tuple] = []  # ("add", stream, prompt, params, future) | ("abort", request_id)
        self._stepping = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._ids = itertools.count()
        self._watch_passes()

    def _watch_passes(self) -> None:
        """Observe tokens per pass by wrapping the scheduler's ``schedule`` (the engine keeps no plan history)."""
        scheduler = getattr(self.engine, "scheduler", None)
        if scheduler is None:
            return
        schedule, observe = scheduler.schedule, self.metrics.tokens_per_pass.observe

        def watched(*args, **kwargs):
            plan = schedule(*args, **kwargs)
            if plan is not None:
                observe(plan.num_tokens)
            return plan

        scheduler.schedule = watched

    # -- life cycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(EngineDead("the server is shutting down"))
        self._executor.shutdown(wait=True)

    # -- requests --------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        scheduler = getattr(self.engine, "scheduler", None)
        queued = sum(1 for op in self._ops if op[0] == "add")
        return queued + (len(scheduler.waiting) if scheduler is not None else 0)

    async def add(self, prompt_token_ids: list[int], sampling_params, request_id=None) -> RequestStream:
        """Queue a request; raises ``ValueError`` (bad request), ``QueueFull`` or ``EngineDead``."""
        request_id = admission_check(self, request_id)
        stream = RequestStream(request_id, len(prompt_token_ids))
        if not self._stepping:
            self._add_now(stream, prompt_token_ids, sampling_params)
        else:
            future = asyncio.get_running_loop().create_future()
            self._ops.append(("add", stream, prompt_token_ids, sampling_params, future))
            await future
        self._wake.set()
        return stream

    def abort(self, request_id) -> None:
        """Drop a request (idempotent); its blocks are freed now, or right after the pass in flight."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        self._timing.pop(request_id, None)
        self.metrics.requests["abort"].inc()
        if self._stepping:
            self._ops.append(("abort", request_id))
        else:
            self.engine.abort(request_id)

    def _add_now(self, stream: RequestStream, prompt, params) -> None:
        self.engine.add_request(prompt, params, request_id=stream.request_id)  # raises ValueError
        self._streams[stream.request_id] = stream
        self._timing[stream.request_id] = _Timing(time.perf_counter())
        self.metrics.prompt_tokens.inc(stream.num_prompt_tokens)

    def _apply_ops(self) -> None:
        ops, self._ops = self._ops, []
        for op in ops:
            if op[0] == "abort":
                self.engine.abort(op[1])
                continue
            _, stream, prompt, params, future = op
            if future.cancelled():
                continue
            try:
                self._add_now(stream, prompt, params)
            except Exception as e:  # ValueError: a bad request, answered 400 by the caller
                future.set_exception(e)
            else:
                future.set_result(None)

    # -- the loop --------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pending = None  # outputs of the last pass, handed out while the next pass runs
        while True:
            self._apply_ops()
            if not self.engine.has_unfinished():
                if pending is not None:
                    self._dispatch(*pending)
                    pending = None
                    await asyncio.sleep(0)
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            self._stepping = True
            step = loop.run_in_executor(self._executor, self._timed_step)
            if pending is not None:  # hand out the last pass's tokens while the GPU runs this one
                self._dispatch(*pending)
            try:
                outputs = await step
            except Exception as e:
                self._fail_all(e)
                return
            finally:
                self._stepping = False
            pending = (outputs, time.perf_counter())
            await asyncio.sleep(0)  # let handlers consume, add and abort between passes

    def _dispatch(self, outputs, now: float) -> None:
        items = []
        for output in outputs or ():
            request_id, tokens, finished, reason = _unpack(output)
            items.append((request_id, tokens, finished, reason, _queue_time(output)))
        deliver(self, items, now)

    def _fail_all(self, error: BaseException) -> None:
        self.error = error
        for stream in self._streams.values():
            stream.queue.put_nowait(EngineDead(f"the engine failed during a forward pass: {error!r}"))
            self.metrics.requests["error"].inc()
        self._streams.clear()
        self._timing.clear()
        for op in self._ops:
            if op[0] == "add" and not op[4].done():
                op[4].set_exception(EngineDead(f"the engine failed: {error!r}"))
        self._ops.clear()

    def _timed_step(self):
        t0 = time.perf_counter()
        try:
            return self.engine.step()
        finally:
            self.busy_s += time.perf_counter() - t0

    # -- introspection ---------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Running/waiting requests and KV use, read from the engine's scheduler and block manager."""
        scheduler = getattr(self.engine, "scheduler", None)
        out = {"running": 0, "waiting": self.num_waiting, "active_streams": len(self._streams),
               "busy_s": self.busy_s}
        if scheduler is None:
            return out
        bm = scheduler.block_manager
        out.update(running=len(scheduler.running), kv_usage=bm.usage, kv_free_blocks=bm.num_free_blocks,
                   kv_total_blocks=bm.num_blocks, preemptions=scheduler.num_preemptions,
                   unfinished=self.engine.has_unfinished())
        return out
