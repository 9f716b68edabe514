"""The engine in its own process (vLLM's engine-core split), so HTTP streaming never holds the engine's GIL.

The engine process owns the ``LLMEngine`` and loops on its own: apply the commands that came in (add, abort),
run a pass, send that pass's outputs, again. It never waits for the API process. The API process (FastAPI,
SSE, detokenization) talks to it over two one-way pipes:

- API -> engine: ``("add", request_id, prompt_token_ids, sampling_params)``, ``("abort", request_id)``,
  ``("stop",)``. A reader thread in the engine process drains the pipe continuously, so a send from the API
  never blocks on a pass in flight.
- engine -> API: ``("ready", info)`` once (limits, tokenizer, pid); ``("state", acks, stats)`` after commands
  were applied (an ack is ``(request_id, error message or None)``; an add the engine refuses, e.g. prompt +
  output can never fit the KV cache, answers 400); ``("out", items, tokens_per_pass, stats)`` once per pass
  with ``(request_id, new token ids, finished, finish_reason, queue time)`` for every request that produced
  tokens; ``("dead", message)`` when a pass raised.

Each message carries the engine's stats (running, waiting, KV blocks, preemptions), so /metrics and /health
read them without touching the engine. The engine process exits when its command pipe closes: the API process
ending for any reason, SIGKILL included, leaves no orphan.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass, field

from engine.server.engine_loop import EngineDead, RequestStream, _Timing, _unpack, admission_check, deliver
from engine.server.metrics import ServingMetrics

START_TIMEOUT_S = 600.0
PIPE_BYTES = 1 << 20  # a few hundred passes of outputs, so a slow reader rarely blocks the engine's send
INIT_ENV = "SPLITFUSE_ENGINE_INIT"  # "module:function" called in the engine process before the engine is built


def _widen(conn) -> None:
    """Best effort: a 1 MiB pipe buffer (Linux F_SETPIPE_SZ) instead of 64 KiB."""
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), 1031, PIPE_BYTES)
    except (ImportError, OSError):
        pass


@dataclass
class EngineSpec:
    """How to build the engine in its process: ``LLMEngine(model, **kwargs)``; ``threads`` sets torch's CPU
    threads there. ``tokenizer`` (API process only, never sent) replaces the model's, e.g. for a model that
    ships none."""

    model: str
    kwargs: dict = field(default_factory=dict)
    threads: int | None = None
    tokenizer: object = None


# -- the engine process ------------------------------------------------------------------------------------------
def _engine_stats(engine, busy_s: float = 0.0) -> dict:
    s = engine.stats()
    return {"running": s.num_running, "waiting": s.num_waiting, "kv_usage": s.kv_usage,
            "kv_free_blocks": s.num_free_blocks, "kv_total_blocks": s.num_blocks,
            "preemptions": s.num_preemptions, "unfinished": engine.has_unfinished(), "busy_s": busy_s}


def _read_commands(conn, commands: queue.SimpleQueue) -> None:
    try:
        while True:
            commands.put(conn.recv())
    except (EOFError, OSError):
        commands.put(None)  # the API process went away


def engine_main(spec: EngineSpec, cmd_conn, out_conn) -> None:
    """Entry point of the engine process (``multiprocessing`` spawn)."""
    try:
        if os.environ.get(INIT_ENV):  # e.g. a benchmark's faster random-weight init, which a spawned process
            import importlib  # would not inherit from its parent's monkeypatching

            module, _, name = os.environ[INIT_ENV].partition(":")
            getattr(importlib.import_module(module), name)()
        if spec.threads:
            import torch

            torch.set_num_threads(spec.threads)
        from engine.llm import LLMEngine

        engine = LLMEngine(spec.model, **spec.kwargs)
    except BaseException as e:  # noqa: BLE001 - reported to the API process, which raises it
        out_conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    config = engine.model_config
    tokenizer = engine.tokenizer
    try:
        import pickle

        pickle.dumps(tokenizer)
    except Exception:  # noqa: BLE001
        tokenizer = None
    out_conn.send(("ready", {"pid": os.getpid(), "max_model_len": engine.max_model_len,
                             "vocab_size": config.vocab_size, "tokenizer": tokenizer,
                             "stats": _engine_stats(engine)}))
    commands: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_commands, args=(cmd_conn, commands), name="engine-commands",
                     daemon=True).start()

    passes: list[int] = []
    busy_s = 0.0  # seconds spent in engine.step()
    engine.scheduler.observe(lambda plan: passes.append(plan.num_tokens))
    while True:
        batch = [] if engine.has_unfinished() else [commands.get()]  # idle: sleep until a command comes
        while True:
            try:
                batch.append(commands.get_nowait())
            except queue.Empty:
                break
        if batch:
            acks = []
            for cmd in batch:
                if cmd is None or cmd[0] == "stop":
                    return
                if cmd[0] == "abort":
                    engine.abort(cmd[1])
                    continue
                _, request_id, prompt, params = cmd
                try:
                    engine.add_request(prompt, params, request_id=request_id)
                except (ValueError, TypeError) as e:
                    acks.append((request_id, str(e)))
                else:
                    acks.append((request_id, None))
            out_conn.send(("state", acks, _engine_stats(engine, busy_s)))
        if not engine.has_unfinished():
            continue
        t0 = time.perf_counter()
        try:
            outputs = engine.step()
        except BaseException as e:  # noqa: BLE001
            out_conn.send(("dead", f"{type(e).__name__}: {e}"))
            return
        busy_s += time.perf_counter() - t0
        items = []
        for output in outputs:
            request_id, tokens, finished, reason = _unpack(output)
            rm = output.metrics
            queue_time = None if rm is None or rm.first_scheduled_time is None else \
                rm.first_scheduled_time - rm.arrival_time
            items.append((request_id, tokens, finished, reason, queue_time))
        if items or passes:  # a pass that scheduled nothing has nothing to say
            out_conn.send(("out", items, passes, _engine_stats(engine, busy_s)))
            passes = []


# -- the API process side ----------------------------------------------------------------------------------------
def tokenize(prompt, tokenizer, vocab_size: int) -> list[int]:
    """``LLMEngine.tokenize`` on the API side (same checks and messages), without importing the engine."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt is a string but the model has no tokenizer; pass token ids instead")
        if not prompt:
            raise ValueError("prompt is empty")
        return list(tokenizer(prompt)["input_ids"])
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
        raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("prompt is empty")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return list(prompt)


class ProcessEngine:
    """``AsyncEngine``'s interface (start/stop, add/abort, stats, metrics, error) over an engine process."""

    def __init__(self, spec: EngineSpec, max_waiting: int = 1024) -> None:
        self.spec = spec
        self.max_waiting = max_waiting
        self.metrics = ServingMetrics(self.stats)
        self.error: BaseException | None = None
        self.info: dict = {}
        self.process = None
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
        """Start the engine process and wait until its engine is built (blocking); returns its ``info``."""
        ctx = multiprocessing.get_context("spawn")
        cmd_r, self._cmd = ctx.Pipe(duplex=False)
        self._out, out_w = ctx.Pipe(duplex=False)
        _widen(self._cmd)
        _widen(self._out)
        child_spec = EngineSpec(self.spec.model, self.spec.kwargs, self.spec.threads)
        self.process = ctx.Process(target=engine_main, args=(child_spec, cmd_r, out_w), name="splitfuse-engine",
                                   daemon=True)
        self.process.start()
        cmd_r.close()  # only the child holds these now: EOF on either side means the other one is gone
        out_w.close()
        deadline = time.monotonic() + timeout
        while not self._out.poll(0.1):
            if not self.process.is_alive():
                raise RuntimeError(f"the engine process exited with code {self.process.exitcode} while starting")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the engine process was not ready after {timeout:.0f} s")
        try:
            msg = self._out.recv()
        except EOFError:
            self.process.join(5)
            msg = ("failed", f"the engine process exited with code {self.process.exitcode} while starting")
        if msg[0] != "ready":
            self.process.join(5)
            raise ValueError(msg[1])
        self.info = msg[1]
        self._engine_stats = self.info.pop("stats")
        return self.info

    async def start(self) -> None:
        if self.process is None:
            await asyncio.get_running_loop().run_in_executor(None, self.launch)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._out.fileno(), self._on_readable)

    async def stop(self) -> None:
        if self._loop is not None and self._out is not None:
            self._loop.remove_reader(self._out.fileno())
        if self.process is not None:
            try:
                self._cmd.send(("stop",))
            except OSError:
                pass
            self._cmd.close()
            await asyncio.get_running_loop().run_in_executor(None, self.process.join, 10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
            self._out.close()
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(EngineDead("the server is shutting down"))
        self._streams.clear()
        self._timing.clear()

    # -- requests --------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self._engine_stats.get("waiting", 0) + self._unacked

    def _send(self, msg) -> None:
        try:
            self._cmd.send(msg)
        except OSError as e:
            self._fail_all(RuntimeError(f"the engine process is gone: {e!r}"))
            raise EngineDead(f"the engine failed and serves no more requests: {self.error!r}") from None

    async def add(self, prompt_token_ids: list[int], sampling_params, request_id=None) -> RequestStream:
        """Queue a request; raises ``ValueError`` (bad request), ``QueueFull`` or ``EngineDead``."""
        request_id = admission_check(self, request_id)
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

    # -- messages from the engine ----------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            while self._out.poll():
                self._handle(self._out.recv())
        except (EOFError, OSError) as e:
            self._loop.remove_reader(self._out.fileno())
            code = self.process.exitcode if self.process is not None else None
            self._fail_all(RuntimeError(f"the engine process exited (code {code}): {e!r}"))

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "out":
            _, items, passes, stats = msg
            for n in passes:
                self.metrics.tokens_per_pass.observe(n)
            self._engine_stats = stats
            deliver(self, items, time.perf_counter())
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

    # -- introspection ---------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Running/waiting requests and KV use as the engine process last reported them (after every pass and
        every batch of commands)."""
        out = dict(self._engine_stats)
        out.update(waiting=self.num_waiting, active_streams=len(self._streams),
                   engine_pid=self.info.get("pid"))
        return out
