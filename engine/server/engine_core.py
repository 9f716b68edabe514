"""The engine side of the server (vLLM's engine core): one loop that owns an ``LLMEngine``.

The loop applies the commands that came in (add, abort), runs a pass, sends that pass's outputs, and again; it
never waits for the API side. It runs in a process of its own (``engine_main``, the default of ``splitfuse
serve``: HTTP streaming never holds the engine's GIL) or in a thread of the API process (``run_engine``), and
talks to ``EngineClient`` over two one-way pipes either way:

- API -> engine: ``("add", request_id, prompt_token_ids, sampling_params)``, ``("abort", request_id)``,
  ``("stop",)``. A reader thread drains the pipe continuously, so a send from the API never blocks on a pass.
- engine -> API: ``("ready", info)`` once (limits, tokenizer, pid) or ``("failed", message)``; ``("state", acks,
  stats)`` after commands were applied (an ack is ``(request_id, error message or None)``: an add the engine
  refuses, e.g. prompt + output can never fit the KV cache, answers 400); ``("out", items, tokens_per_pass,
  stats)`` once per pass with the pass's ``LLMEngine.step_deltas`` (``(request_id, new token ids, finished,
  finish_reason, queue time)`` for every request that produced tokens); ``("dead", message)`` when a pass raised.

Each message carries the engine's stats (running, waiting, KV blocks, preemptions), so /metrics and /health read
them without touching the engine. The loop ends when its command pipe closes: the API process ending for any
reason, SIGKILL included, leaves no orphan engine process.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import threading
import time
from dataclasses import dataclass, field

from engine.server.heap import freeze_startup_heap

INIT_ENV = "SPLITFUSE_ENGINE_INIT"  # "module:function" called in the engine process before the engine is built


@dataclass
class EngineSpec:
    """How to build the engine in its process: ``LLMEngine(model, **kwargs)``; ``threads`` sets torch's CPU
    threads there. ``tokenizer`` (API process only, never sent) replaces the model's, e.g. for a model that
    ships none. ``pass_trace``: a file to write the engine's pass-level trace to when it stops (``PassTrace``)."""

    model: str
    kwargs: dict = field(default_factory=dict)
    threads: int | None = None
    tokenizer: object = None
    pass_trace: str | None = None


class PassTrace:
    """What the engine did, pass by pass and request by request, for comparing the simulator with it: one JSON
    line per pass (its ``PassRecord``: times on ``time.perf_counter``'s clock, device seconds, features, path;
    ``sent``, when the loop had sent its outputs; and the pass's shape: ``decode_contexts`` and ``chunks`` as
    [cached prefix, new tokens, prompt tokens left afterwards], what ``calibration.plans.PassSpec`` takes to run
    the same pass again) and per finished request (when its add command reached the engine process and when the
    loop took it in, between two passes; the end time of each pass that gave it tokens). Kept in memory and
    written when the loop ends, so tracing costs the loop no I/O."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.passes: list[tuple] = []
        self.added: dict[object, float] = {}
        self.tokens: dict[object, list[float]] = {}
        self.requests: list[dict] = []
        self._shape: tuple[list, list] | None = None  # of the plan scheduled last

    def add(self, request_id, received: float, added: float) -> None:
        self.added[request_id] = (received, added)

    def observe(self, plan) -> None:
        """Keep the shape of a plan the scheduler made (a scheduler observer: called before the pass runs)."""
        d = plan.num_decodes
        chunks = [[start, n, request.num_tokens - start - n] for request, start, n in
                  zip(plan.requests[d:], plan.start_positions[d:], plan.num_new_tokens[d:])]
        self._shape = (plan.start_positions[:d], chunks)

    def record(self, pass_record, deltas, sent: float) -> None:
        """Keep a pass and its ``LLMEngine.step_deltas``."""
        self.passes.append((pass_record, sent, self._shape))
        for request_id, tokens, finished, reason, _ in deltas:
            times = self.tokens.setdefault(request_id, [])
            times.extend([pass_record.end] * len(tokens))
            if finished:
                received, added = self.added.pop(request_id, (None, None))
                self.requests.append({"kind": "request", "id": request_id, "received": received, "added": added,
                                      "token_times": self.tokens.pop(request_id), "finish_reason": reason})

    def write(self) -> None:
        with open(self.path, "w") as f:
            for r, sent, shape in self.passes:
                decodes, chunks = shape or (None, None)
                f.write(json.dumps({"kind": "pass", "start": r.start, "scheduled": r.scheduled, "launched": r.launched,
                                    "sampled": r.sampled, "updated": r.updated, "end": r.end, "sent": sent,
                                    "device_s": r.device_s, **r.features._asdict(), "path": r.path, "ahead": r.ahead,
                                    "discarded": r.discarded,
                                    "num_outputs": r.num_outputs, "decode_contexts": decodes,
                                    "chunks": chunks}) + "\n")
            for row in self.requests:
                f.write(json.dumps(row) + "\n")


def engine_stats(engine, busy_s: float = 0.0) -> dict:
    """What /health and /metrics show of the engine, from its scheduler's stats."""
    s = engine.stats()
    return {"running": s.num_running, "waiting": s.num_waiting, "kv_usage": s.kv_usage,
            "kv_free_blocks": s.num_free_blocks, "kv_total_blocks": s.num_blocks,
            "kv_capacity_tokens": s.kv_capacity_tokens,
            "preemptions": s.num_preemptions, "passes": s.num_passes, "unfinished": engine.has_unfinished(),
            "busy_s": busy_s}


def _read_commands(conn, commands: queue.SimpleQueue) -> None:
    """Drain the command pipe into ``commands`` as (time received, command); None when the API side went away."""
    try:
        while True:
            cmd = conn.recv()
            commands.put((time.perf_counter(), cmd))
    except (EOFError, OSError):
        commands.put((time.perf_counter(), None))


def _picklable(obj):
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - any tokenizer that cannot travel stays behind
        return None
    return obj


def engine_main(spec: EngineSpec, cmd_conn, out_conn) -> None:
    """Entry point of the engine process (``multiprocessing`` spawn): build the engine, then ``run_engine``."""
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
    freeze_startup_heap()
    run_engine(engine, cmd_conn, out_conn, pid=os.getpid(), pass_trace=spec.pass_trace)


def run_engine(engine, cmd_conn, out_conn, pid: int | None = None, pass_trace: str | None = None) -> None:
    """Serve ``engine`` over the pipes until the stop command or the command pipe closes. ``pid``: the engine's
    own process, when it has one; ``pass_trace``: write a ``PassTrace`` there at the end."""
    trace = PassTrace(pass_trace) if pass_trace else None
    try:
        _serve(engine, cmd_conn, out_conn, pid, trace)
    finally:
        if trace is not None:
            trace.write()


def _serve(engine, cmd_conn, out_conn, pid: int | None, trace: PassTrace | None) -> None:
    out_conn.send(("ready", {"pid": pid, "max_model_len": engine.max_model_len,
                             "vocab_size": engine.model_config.vocab_size,
                             "tokenizer": _picklable(engine.tokenizer), "stats": engine_stats(engine)}))
    commands: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_commands, args=(cmd_conn, commands), name="engine-commands",
                     daemon=True).start()
    passes: list[int] = []  # tokens of each pass since the last message
    engine.scheduler.observe(lambda plan: passes.append(plan.num_tokens))
    last_pass: list = []  # this step's PassRecord, for the trace
    if trace is not None:
        engine.scheduler.observe(trace.observe)
        engine.trace_passes(last_pass.append, device_time=True)
    busy_s = 0.0  # seconds spent in engine.step_deltas()
    while True:
        batch = [] if engine.has_unfinished() else [commands.get()]  # idle: sleep until a command comes
        while True:
            try:
                batch.append(commands.get_nowait())
            except queue.Empty:
                break
        if batch:
            acks = []
            for received, cmd in batch:
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
                    if trace is not None:
                        trace.add(request_id, received, time.perf_counter())
            out_conn.send(("state", acks, engine_stats(engine, busy_s)))
        if not engine.has_unfinished():
            continue
        t0 = time.perf_counter()
        try:
            items = engine.step_deltas()
        except BaseException as e:  # noqa: BLE001
            out_conn.send(("dead", f"{type(e).__name__}: {e}"))
            return
        busy_s += time.perf_counter() - t0
        if items or passes:  # a pass that scheduled nothing has nothing to say
            out_conn.send(("out", items, passes, engine_stats(engine, busy_s)))
            passes.clear()
        if last_pass:
            trace.record(last_pass.pop(), items, time.perf_counter())
