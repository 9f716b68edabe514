"""The API side of the server: ``EngineClient`` talks to the engine loop (``engine_core``) over two pipes and
streams each request's tokens to a ``RequestStream``.

The engine runs in its own process (given an ``EngineSpec``) or in a thread of this process (given a built
``LLMEngine``, ``splitfuse serve --no-engine-process``); the messages and everything here are the same either
way. A consumer that goes away (client disconnect, cancel) aborts its request, which frees its KV blocks before
the engine's next pass.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import threading
import time
from dataclasses import dataclass, field

from engine.server.engine_core import EngineSpec, engine_main, run_engine
from engine.server.metrics import ServingMetrics

START_TIMEOUT_S = 600.0
PIPE_BYTES = 1 << 20  # a few hundred passes of outputs, so a slow reader rarely blocks the engine's send


class QueueFull(Exception):
    """The waiting queue is at its bound (answer 429)."""


class EngineDead(Exception):
    """The engine failed or stopped; it serves nothing more (answer 503, /health fails)."""


class ServerShutdown(EngineDead):
    """The server is stopping and the request did not finish within its shutdown timeout."""


@dataclass
class StreamOutput:
    """New tokens of one request since the last read; ``finished`` with a ``finish_reason`` at the end."""

    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None


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


@dataclass
class _Timing:
    arrival: float
    last_token: float | None = None


def _widen(conn) -> None:
    """Best effort: a 1 MiB pipe buffer (Linux F_SETPIPE_SZ) instead of 64 KiB."""
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), 1031, PIPE_BYTES)
    except (ImportError, OSError):
        pass


class EngineClient:
    """Start/stop, add/abort, stats and metrics of one engine, in its own process or in a thread here."""

    def __init__(self, engine, max_waiting: int = 1024, model_name: str = "") -> None:
        """``engine``: an ``EngineSpec`` (its process is started by ``launch``) or a built ``LLMEngine``;
        ``model_name`` labels its metrics."""
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = ServingMetrics(self.stats, model_name)
        self.error: BaseException | None = None
        self.on_dead = None  # called once when the engine fails
        self.info: dict = {}
        self.worker: multiprocessing.Process | threading.Thread | None = None
        self._engine_stats: dict = {}
        self._streams: dict[object, RequestStream] = {}
        self._timing: dict[object, _Timing] = {}
        self._acks: dict[object, asyncio.Future] = {}
        self._unacked = 0
        self._ids = itertools.count()
        self._cmd = self._out = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle ------------------------------------------------------------------------------------------
    def launch(self, timeout: float = START_TIMEOUT_S) -> dict:
        """Start the engine loop and wait until its engine is built (blocking); returns its ``info``."""
        in_process = isinstance(self.engine, EngineSpec)
        ctx = multiprocessing.get_context("spawn")
        cmd_r, self._cmd = ctx.Pipe(duplex=False)
        self._out, out_w = ctx.Pipe(duplex=False)
        _widen(self._cmd)
        _widen(self._out)
        if in_process:
            spec = EngineSpec(self.engine.model, self.engine.kwargs, self.engine.threads,  # the tokenizer stays
                              pass_trace=self.engine.pass_trace)
            self.worker = ctx.Process(target=engine_main, args=(spec, cmd_r, out_w), name="splitfuse-engine",
                                      daemon=True)
        else:
            self.worker = threading.Thread(target=run_engine, args=(self.engine, cmd_r, out_w),
                                           name="splitfuse-engine", daemon=True)
        self.worker.start()
        if in_process:
            cmd_r.close()  # only the child holds these now: EOF on either side means the other one is gone
            out_w.close()
        deadline = time.monotonic() + timeout
        while not self._out.poll(0.1):
            if not self.worker.is_alive():
                raise RuntimeError(f"the engine exited while starting{self._exit_code()}")
            if time.monotonic() > deadline:
                self._kill()
                raise RuntimeError(f"the engine was not ready after {timeout:.0f} s")
        try:
            msg = self._out.recv()
        except EOFError:
            self.worker.join(5)
            msg = ("failed", f"the engine exited while starting{self._exit_code()}")
        if msg[0] != "ready":
            self.worker.join(5)
            raise ValueError(msg[1])
        self.info = msg[1]
        self._engine_stats = self.info.pop("stats")
        return self.info

    def _exit_code(self) -> str:
        code = getattr(self.worker, "exitcode", None)
        return f" (exit code {code})" if code is not None else ""

    def _kill(self) -> None:
        if isinstance(self.worker, multiprocessing.process.BaseProcess):
            self.worker.kill()
            self.worker.join(5)

    async def start(self) -> None:
        if self.worker is None:
            await asyncio.get_running_loop().run_in_executor(None, self.launch)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._out.fileno(), self._on_readable)

    async def stop(self) -> None:
        if self._loop is not None and self._out is not None:
            self._loop.remove_reader(self._out.fileno())
        if self.worker is not None:
            try:
                self._cmd.send(("stop",))
            except OSError:
                pass
            self._cmd.close()
            await asyncio.get_running_loop().run_in_executor(None, self.worker.join, 10)
            if self.worker.is_alive():
                self._kill()
            self._out.close()
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(EngineDead("the server is shutting down"))
        self._streams.clear()
        self._timing.clear()

    # -- requests --------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self._engine_stats.get("waiting", 0) + self._unacked

    def _admit(self, request_id):
        """A live engine, room in the waiting queue, an unused id (one is made when None); returns the id."""
        if self.error is not None:
            raise EngineDead(f"the engine failed and serves no more requests: {self.error!r}")
        if self.num_waiting >= self.max_waiting:
            self.metrics.rejected.inc()
            raise QueueFull(f"the waiting queue is full ({self.max_waiting} requests); retry later")
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        return request_id

    def _send(self, msg) -> None:
        try:
            self._cmd.send(msg)
        except OSError as e:
            self._fail_all(RuntimeError(f"the engine is gone: {e!r}"))
            raise EngineDead(f"the engine failed and serves no more requests: {self.error!r}") from None

    async def add(self, prompt_token_ids: list[int], sampling_params, request_id=None) -> RequestStream:
        """Queue a request; raises ``ValueError`` (bad request), ``QueueFull`` or ``EngineDead``."""
        request_id = self._admit(request_id)
        stream = RequestStream(request_id, len(prompt_token_ids))
        ack = self._loop.create_future()
        # registered before the send: the engine's first tokens may come in the same read as its ack
        self._streams[request_id] = stream
        self._timing[request_id] = _Timing(time.perf_counter())
        self._acks[request_id] = ack
        self._send(("add", request_id, list(prompt_token_ids), sampling_params))
        self._unacked += 1
        try:
            await ack
        except ValueError:
            self._streams.pop(request_id, None)
            self._timing.pop(request_id, None)
            raise
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        self.metrics.prompt_tokens.inc(stream.num_prompt_tokens)
        return stream

    def abort(self, request_id) -> None:
        """Drop a request (idempotent); the engine frees its blocks before its next pass."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        self._timing.pop(request_id, None)
        self.metrics.requests["abort"].inc()
        if self.error is None:
            try:
                self._cmd.send(("abort", request_id))
            except OSError:
                pass

    def abort_all(self, error: EngineDead) -> int:
        """End every request in flight with ``error`` (their streams raise it) and abort them in the engine;
        returns how many there were."""
        ids = list(self._streams)
        for request_id in ids:
            self._streams[request_id].queue.put_nowait(error)
            self.abort(request_id)
        return len(ids)

    # -- messages from the engine ----------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            while self._out.poll():
                self._handle(self._out.recv())
        except (EOFError, OSError) as e:
            self._loop.remove_reader(self._out.fileno())
            self._fail_all(RuntimeError(f"the engine exited{self._exit_code()}: {e!r}"))

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "out":
            _, items, passes, stats = msg
            for n in passes:
                self.metrics.tokens_per_pass.observe(n)
            self._engine_stats = stats
            self._deliver(items, time.perf_counter())
        elif kind == "state":
            _, acks, stats = msg
            self._engine_stats = stats
            for request_id, err in acks:
                self._unacked -= 1
                future = self._acks.pop(request_id, None)
                if future is None or future.done():
                    continue
                if err is None:
                    future.set_result(None)
                else:
                    future.set_exception(ValueError(err))
        elif kind == "dead":
            self._loop.remove_reader(self._out.fileno())
            self._fail_all(RuntimeError(msg[1]))

    def _deliver(self, items, now: float) -> None:
        """Hand (request_id, new token ids, finished, finish_reason, queue time) items to their streams and observe
        the latency metrics."""
        m = self.metrics
        for request_id, tokens, finished, reason, queue_time in items:
            stream = self._streams.get(request_id)
            if stream is None:  # aborted while the pass ran
                continue
            timing = self._timing[request_id]
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
                del self._streams[request_id], self._timing[request_id]
            stream.queue.put_nowait(StreamOutput(tokens, finished, reason if finished else None))

    def _fail_all(self, error: BaseException) -> None:
        if self.error is not None:
            return
        self.error = error
        for stream in self._streams.values():
            stream.queue.put_nowait(EngineDead(f"the engine failed during a forward pass: {error!r}"))
            self.metrics.requests["error"].inc()
        self._streams.clear()
        self._timing.clear()
        for future in self._acks.values():
            if not future.done():
                future.set_exception(EngineDead(f"the engine failed: {error!r}"))
        self._acks.clear()
        self._unacked = 0
        if self.on_dead is not None:
            self.on_dead()

    # -- introspection ---------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Running/waiting requests and KV use as the engine last reported them (after every pass and every batch
        of commands)."""
        out = dict(self._engine_stats)
        out.update(waiting=self.num_waiting, active_streams=len(self._streams))
        return out
