"""The GPU engine against its rooflines and against transformers, in ONE run on one card (issue 3).

Run from the repository root on a CUDA machine: ``python -m benchmarks.engine_gpu [--out DIR]``. On a random-
weight Llama-2-7B-shaped model in bf16 it measures, in this order and in this one process: the card's ceilings
(device-to-device copy counting bytes read + written; an 8192^3 bf16 matmul on random data); decode steps
(batch 1 and 64 at ~1k context, as ``LLMEngine.step`` runs them with and without passes enqueued ahead, one pass
through ``runner.run``, and the step's graph alone) against (weight + KV bytes) / copy bandwidth; a 2,048-token
prefill against the matmul rate; SplitFuse passes at budget 768 against a pure prefill of the same token count,
timed in interleaved rounds; host time per pass;
an offline run of 1,000 seeded requests, traced pass by pass (``LLMEngine.trace_passes`` with device time: host
time of schedule, launch and update, GPU time, KV-slot occupancy at peak); then, after ``LLMEngine.close``,
transformers ``generate`` on a seeded subset of whole padded batches of 64. Where nvidia-ml-py is installed it
also measures energy (NVML): the card's cost of reading a GB and of a bf16 TFLOP, the prefill's and both offline
runs' joules, and the offline run's energy floor, the least time its unavoidable work takes at the power limit.
It prints a table last and writes ``engine_gpu_<card>.json`` (``benchmarks.common.write_results``). Imports
torch, numpy, transformers and this repository (no simpy).

``pass_timeline_gpu``, ``pass_energy_gpu`` and ``server_gpu`` import its engine (``bench_engine``), hand-built
passes (``Passes``, ``time_pass``) and workload (``workload``, ``fits_seqs``) from here.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import time

import numpy as np
import torch

import engine.inputs
import kernels
from benchmarks.common import run_metadata, write_results
from calibration.plans import PassSpec, build_plan, release
from engine.llm import LLMEngine, PassRecord
from engine.policy import BatchPlan, SamplingParams
from engine.weights import random_init

MODEL = "llama-2-7b"
DEV = torch.device("cuda")
SEED = 1234
VOCAB = 32000  # token ids drawn in [3, VOCAB)


def bench_engine(token_budget: int = 2048) -> LLMEngine:
    """The benchmarks' engine: random-weight ``MODEL`` in bf16 on the GPU (weights drawn there from ``SEED``),
    ``max_num_seqs`` 256 (so decode graphs up to batch 256), 90% of the card's memory. Its KV cache holds zeros
    until ``random_kv``."""
    return LLMEngine(MODEL, dtype="bfloat16", device="cuda", max_num_batched_tokens=token_budget, max_num_seqs=256,
                     gpu_memory_utilization=0.9, seed=SEED)


def random_kv(llm: LLMEngine) -> None:
    """Fill the KV cache with random values: never time attention on zeros."""
    with torch.no_grad():
        llm.runner.kv_cache.normal_()


def energy_meter():
    """A ``calibration.power.EnergyMeter`` of this card, or None where NVML (nvidia-ml-py) is missing: no energy
    figures."""
    from calibration.power import card_meter

    return card_meter(torch.cuda.current_device())


def energy_summary(meter, seconds: float) -> dict:
    """Joules and mean power of a timed span, and the least time that energy takes at the card's power limit."""
    return {**meter.summary(seconds), "power_limit_w": meter.limit_w,
            "seconds_at_power_limit": meter.joules / meter.limit_w}


def ceilings() -> dict:
    """The copy-bandwidth and bf16-matmul ceilings, measured as the calibration sweep measures them."""
    from calibration.sweep import device_ceilings

    c = device_ceilings(torch.device(DEV))
    out = {"copy_Bps": c["copy_bandwidth_Bps"], "matmul_flops": c["matmul_flops"],
           "matmul_flops_sustained": sustained_matmul_flops()}
    meter = energy_meter()
    if meter:
        out["energy"] = energy_costs(meter)
    return out


def energy_costs(meter, seconds: float = 1.5, m: int = 8192, gib: float = 4.0) -> dict:
    """What work costs in energy on this card, above its idle power: joules per GB of a read-only stream (a
    reduction over ``gib``) and per TFLOP of back-to-back bf16 ``m``^3 products, each run for ``seconds``.
    At the power limit a run can take no less than its work's energy at these costs / (limit - idle)."""
    from calibration.power import idle_watts

    idle_w = idle_watts(meter)
    x = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=DEV).normal_()
    a = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)

    def per_unit(fn, units: float) -> tuple[float, float]:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        n = max(10, int(seconds / (time.perf_counter() - t0)))
        with meter:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            span = time.perf_counter() - t0
        return (meter.joules - idle_w * span) / (n * units), meter.joules / span

    read_j, read_w = per_unit(lambda: x.sum(), x.numel() * 2 / 1e9)
    flop_j, flop_w = per_unit(lambda: torch.matmul(a, b), 2 * m**3 / 1e12)
    return {"idle_w": idle_w, "power_limit_w": meter.limit_w, "read_j_per_gb": read_j, "read_w": read_w,
            "matmul_j_per_tflop": flop_j, "matmul_w": flop_w}


def sustained_matmul_flops(seconds: float = 3.0, m: int = 8192) -> float:
    """The same bf16 product's rate at the card's steady state: timed (median of 10) after ``seconds`` of back-to-
    back products. Under a power cap the SM clock falls within a second of full load (an H200 at ~690 W ran at
    1.45-1.6 GHz instead of 1.98), and a timed prefill (13 passes back to back) runs in that state, while
    ``device_ceilings`` times ~20 ms of products from idle."""
    a = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=DEV, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * m**3 / float(np.median(times))


# ---- hand-built passes over the engine's own cache --------------------------------------------------------
GREEDY = SamplingParams(max_tokens=4096, temperature=0, ignore_eos=True)


class Passes:
    """Plans of decodes and prompt chunks over the engine's KV cache, each made as the calibration sweep makes its
    passes (``calibration.plans.build_plan``): a SplitFuse scheduler of the plan's own takes its requests as
    running, their context computed (KV blocks taken; contents are the cache's random values), and schedules them,
    so a plan is exactly what the engine would run. Each plan has its own scheduler and block manager over the
    same cache, so two plans' block tables may share physical blocks (timing only; nothing reads their outputs).
    The engine's own scheduler is not involved: ``release`` ends the plans' requests."""

    def __init__(self, llm: LLMEngine, rng: np.random.Generator):
        self.llm, self.rng, self.schedulers = llm, rng, []

    def plan(self, decodes: int = 0, ctx: int = 1024, chunk: int = 0, prefix: int = 0) -> BatchPlan:
        """``decodes`` greedy decodes at context ``ctx`` (their new token's position is ``ctx`` - 1, so each
        attends ``ctx`` tokens), then a chunk of ``chunk`` tokens that ends a prompt, after ``prefix`` computed
        ones."""
        spec = PassSpec("bench", decode_contexts=(ctx - 1,) * decodes, chunks=((prefix, chunk, 0),) if chunk else ())
        llm = self.llm
        scheduler, plan, _ = build_plan(spec, llm.num_kv_blocks, llm.block_size, self.rng,
                                        llm.model_config.vocab_size, llm.max_model_len, GREEDY)
        self.schedulers.append(scheduler)
        return plan

    def release(self) -> None:
        for scheduler in self.schedulers:
            release(scheduler)
        self.schedulers = []


def time_pass(llm: LLMEngine, plan: BatchPlan, repeats: int = 20, use_graphs: bool = True) -> dict:
    """Median GPU ms (events around runner.run: copy in, forward, sampling) and wall ms (host clock, incl. the
    sync) of one pass; host ms of packing its inputs alone. ``use_graphs=False``: eager even where a graph fits."""
    runner = llm.runner
    for _ in range(3):
        runner.run(plan, use_graphs=use_graphs)
    torch.cuda.synchronize()
    gpu, wall = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        runner.run(plan, use_graphs=use_graphs)
        end.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(start.elapsed_time(end))
    graph = runner.graphs.key(plan) if use_graphs and runner.graphs is not None else None
    pack = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if graph:
            engine.inputs.pack_inputs(plan, runner.block_size, pad_to=runner.graphs.layouts[graph],
                                      all_rows=graph[0] == "decode")
        else:
            engine.inputs.pack_inputs(plan, runner.block_size)
        pack.append((time.perf_counter() - t0) * 1e3)
    return {"gpu_ms": float(np.median(gpu)), "gpu_ms_all": gpu, "wall_ms": float(np.median(wall)),
            "pack_ms": float(np.median(pack)),
            "gpu_ms_spread": [float(np.min(gpu)), float(np.max(gpu))], "wall_ms_spread": [float(np.min(wall)),
            float(np.max(wall))], "cuda_graph": None if graph is None else f"{graph[0]} {graph[1]}",
            "tokens": plan.num_tokens, "seqs": plan.num_seqs}


def steady_decode(llm: LLMEngine, batch: int, pipelined: bool, prompt_len: int = 988, skip: int = 4,
                  steps: int = 64) -> dict:
    """Decode steps as the engine runs them: ``batch`` greedy requests with prompts of ``prompt_len`` tokens are
    prefilled, then ``steps`` calls of ``LLMEngine.step`` (after ``skip``) are timed on the host clock, each
    returning its sampled tokens (~1k context on average: SplitFuse starts the first requests' decodes while the
    last ones prefill, so at batch 64 contexts differ), then the requests are aborted. ``pipelined``: with
    ``pipeline_decodes`` (the next decode pass enqueued before the host waits for this one)."""
    llm.pipeline_decodes = pipelined
    rng = np.random.default_rng(SEED + batch)
    params = SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)  # none finishes in the timed steps
    ids = [llm.add_request(rng.integers(3, VOCAB, prompt_len).tolist(), params) for _ in range(batch)]
    generated = dict.fromkeys(ids, 0)  # output tokens per request so far

    def step() -> None:
        for out in llm.step():
            generated[out.request_id] += len(out.new_token_ids)

    while min(generated.values()) == 0:  # until every request decodes
        step()
    for _ in range(skip):
        step()
    contexts = [prompt_len + n for n in generated.values()]
    stats = dict(llm.pipeline_stats)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.step()
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
    stats = {k: v - stats[k] for k, v in llm.pipeline_stats.items()}
    for request_id in ids:
        llm.abort(request_id)
    llm.step()  # discards a pass enqueued ahead
    llm.pipeline_decodes = True
    return {"step_ms": step_ms, "steps": steps, "mean_context": float(np.mean(contexts)) + (steps - 1) / 2,
            "passes_enqueued_ahead": stats}


def kernel_kind(name: str) -> str:
    n = name.lower()
    for key, kind in (("_attention_kernel", "attention"), ("_merge_splits", "attention"), ("write_kv", "write_kv"),
                      ("rms_norm", "rms_norm"), ("rotary", "rotary"), ("silu_and_mul", "silu_and_mul"),
                      ("_linear_kernel", "gemm"), ("splitkreduce", "gemm"),
                      ("gemm", "gemm"), ("gemv", "gemm"), ("nvjet", "gemm"), ("cutlass", "gemm"), ("sm90", "gemm"),
                      ("argmax", "sampling"), ("reduce", "sampling")):
        if key in n:
            return kind
    return "other"


def breakdown(llm: LLMEngine, plan: BatchPlan, repeats: int = 5) -> dict:
    """Kernel time per kind (torch.profiler, eager pass) against the pass's span: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    llm.runner.run(plan, use_graphs=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            llm.runner.run(plan, use_graphs=False)
        torch.cuda.synchronize()
    kinds: dict[str, float] = {}
    count = 0
    for evt in prof.key_averages():
        us = evt.self_device_time_total if hasattr(evt, "self_device_time_total") else evt.self_cuda_time_total
        if us <= 0:
            continue
        kind = kernel_kind(evt.key)
        kinds[kind] = kinds.get(kind, 0.0) + us / repeats / 1e3
        count += evt.count
    out = {"kernel_ms": {k: round(v, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
           "kernel_ms_total": sum(kinds.values()), "kernels_per_pass": count / repeats,
           "top": [(e.key[:60], round(e.self_device_time_total / repeats / 1e3, 4), e.count // repeats)
                   for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:8]]}
    print(f"breakdown {plan.num_tokens} tokens / {plan.num_seqs} seqs: {out}", flush=True)
    return out


def model_bytes_and_flops(llm: LLMEngine) -> tuple[int, int]:
    """(bytes of weights a decode step reads: everything but the embedding table; linear params per token)."""
    weights = sum(p.numel() * p.element_size() for n, p in llm.model.named_parameters() if "embed_tokens" not in n)
    linear = sum(p.numel() for n, p in llm.model.named_parameters()
                 if p.dim() == 2 and "embed_tokens" not in n and "lm_head" not in n)
    return weights, linear


def micro(llm: LLMEngine, ceil: dict, rng: np.random.Generator) -> dict:
    cfg = llm.model_config
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    weight_bytes, linear_params = model_bytes_and_flops(llm)
    lm_head = cfg.hidden_size * cfg.vocab_size
    passes = Passes(llm, rng)
    res = {}

    def attn_flops(q_lens_ctx) -> float:
        return sum(4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * sum(range(c - q + 1, c + 1))
                   for q, c in q_lens_ctx)

    for batch in (1, 64):
        plan = passes.plan(decodes=batch, ctx=1024)
        t = time_pass(llm, plan)
        nbytes = weight_bytes + batch * 1024 * kv_per_token
        t.update(bytes=nbytes, floor_ms=nbytes / ceil["copy_Bps"] * 1e3)
        t["frac_roofline"] = t["floor_ms"] / t["gpu_ms"]
        # the step's GPU time alone: its graph replayed back to back, no host work between (pack, copy, sampling)
        llm.runner.run(plan)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            llm.runner.replay_graph(plan)
        end.record()
        end.synchronize()
        t["replay_only_ms"] = start.elapsed_time(end) / 20
        t["frac_roofline_replay_only"] = t["floor_ms"] / t["replay_only_ms"]
        res[f"decode_b{batch}_1k"] = t
        passes.release()
        for pipelined in (True, False):
            steady = steady_decode(llm, batch, pipelined)
            steady.update(floor_ms=(weight_bytes + batch * steady["mean_context"] * kv_per_token)
                          / ceil["copy_Bps"] * 1e3)
            steady["frac_roofline"] = steady["floor_ms"] / steady["step_ms"]
            t["engine_steps_pipelined" if pipelined else "engine_steps_unpipelined"] = steady
        print(f"decode batch {batch}: {t}", flush=True)
    plan = passes.plan(chunk=2048)
    meter = energy_meter()
    with meter or contextlib.nullcontext():
        t0 = time.perf_counter()
        t = time_pass(llm, plan, repeats=10)
        span = time.perf_counter() - t0
    if meter:
        t["energy"] = energy_summary(meter, span)  # the passes timed back to back, with their warm-up
    flops = 2.0 * linear_params * 2048 + 2.0 * lm_head + attn_flops([(2048, 2048)])
    t.update(flops=flops, tflops=flops / t["gpu_ms"] / 1e9)
    t["frac_matmul"] = flops / (t["gpu_ms"] * 1e-3) / ceil["matmul_flops"]
    t["frac_matmul_sustained"] = flops / (t["gpu_ms"] * 1e-3) / ceil["matmul_flops_sustained"]
    res["prefill_2048"] = t
    # the same pass from idle, as the burst ceiling is timed: each after 2 s of rest
    idle = []
    for _ in range(3):
        time.sleep(2.0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        llm.runner.run(plan)
        end.record()
        end.synchronize()
        idle.append(start.elapsed_time(end))
    t["from_idle_ms"] = idle
    t["frac_matmul_from_idle"] = flops / (float(np.median(idle)) * 1e-3) / ceil["matmul_flops"]
    passes.release()
    print(f"prefill 2048: {t}", flush=True)
    # SplitFuse passes and the pure prefill they are compared with, timed in interleaved rounds: the card's clock
    # moves with its power draw (one pass ranged 19.4-22.3 ms over 20 back-to-back runs), and alternating the
    # passes lets that drift fall on all of them alike.
    plans = {"prefill_768": passes.plan(chunk=768)}
    for decodes, ctx in ((16, 1024), (64, 1024), (64, 256)):
        plans[f"mixed_768_{decodes}x{ctx}"] = passes.plan(decodes=decodes, ctx=ctx, chunk=768 - decodes)
    samples = {name: [] for name in plans}
    for _ in range(5):
        for name, plan in plans.items():
            res[name] = time_pass(llm, plan, repeats=4)
            samples[name] += res[name]["gpu_ms_all"]
    for name, times in samples.items():
        res[name].update(gpu_ms=float(np.median(times)), gpu_ms_all=times,
                         gpu_ms_spread=[float(np.min(times)), float(np.max(times))], rounds=5)
    for (decodes, ctx), name in zip(((16, 1024), (64, 1024), (64, 256)), list(plans)[1:]):
        t = res[name]
        t["vs_prefill_768"] = t["gpu_ms"] / res["prefill_768"]["gpu_ms"] - 1
        t["decode_kv_read_ms"] = decodes * ctx * kv_per_token / ceil["copy_Bps"] * 1e3
        print(f"mixed 768 ({decodes} decodes @ {ctx}): {t}", flush=True)
    passes.release()
    # The profiler sees eager passes: within kernels.graph_kernels() they run the few-row linear kernel as the
    # decode graphs do; the _cublas breakdown is the same pass outside it.
    for name, kw, graph_kernels in (("breakdown_decode_b1", {"decodes": 1}, True),
                                     ("breakdown_decode_b1_cublas", {"decodes": 1}, False),
                                     ("breakdown_prefill_2048", {"chunk": 2048}, False)):
        try:
            with kernels.graph_kernels() if graph_kernels else contextlib.nullcontext():
                res[name] = breakdown(llm, passes.plan(**kw))
        except Exception as e:  # the profiler is a diagnosis, not a measure: keep going without it
            res[name] = {"error": repr(e)}
        passes.release()
    # the same 64x1k decodes without CUDA graphs: what the graphs buy
    plan = passes.plan(decodes=64, ctx=1024)
    res["decode_b64_1k_eager"] = time_pass(llm, plan, repeats=10, use_graphs=False)
    plan1 = passes.plan(decodes=1, ctx=1024)
    res["decode_b1_1k_eager"] = time_pass(llm, plan1, repeats=10, use_graphs=False)
    # small passes with prompt tokens, replayed vs eager: what the mixed-pass graphs buy (wall clock: host-bound)
    for chunk, decodes in ((16, 0), (128, 0), (512, 0), (500, 12), (1000, 24)):
        plan = passes.plan(decodes=decodes, ctx=1024, chunk=chunk)
        res[f"small_{chunk}+{decodes}d_eager"] = time_pass(llm, plan, repeats=10, use_graphs=False)
        res[f"small_{chunk}+{decodes}d_graph"] = time_pass(llm, plan, repeats=10)
        passes.release()
        print(f"pass {chunk} + {decodes} decodes: eager {res[f'small_{chunk}+{decodes}d_eager']}, "
              f"graph {res[f'small_{chunk}+{decodes}d_graph']}", flush=True)
    passes.release()
    return res


# ---- offline throughput -----------------------------------------------------------------------------------
def workload(n: int = 1000, seed: int = SEED) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(128, 2049, n)
    outputs = rng.integers(64, 513, n)
    return [(rng.integers(3, VOCAB, int(p)).tolist(), int(o)) for p, o in zip(prompts, outputs)]


class Instrument:
    """The offline run pass by pass, from the engine's pass trace (``LLMEngine.trace_passes`` with device time):
    host time of schedule, launch (pack, copy, replay or kernel launches) and update, each pass's GPU time (CUDA
    events around its launch, passes enqueued ahead too; a discarded one is only counted, in ``enqueued_ahead``),
    path and features, KV occupancy after each step, and Triton compilations (``triton.knobs.runtime
    .jit_cache_hook``). ``stop`` ends the trace and restores the hook."""

    def __init__(self, llm: LLMEngine):
        from triton import knobs

        self.llm, self.records, self.jit = llm, [], []
        self.peak_used = self.peak_live = 0
        self.ahead_before = dict(llm.pipeline_stats)
        # Triton compilations inside the timed run (each a stall of 1-2 s), with the pass they happened in
        self.knobs, self.jit_hook = knobs, knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = lambda *, repr, **kw: self.jit.append((len(self.records), repr[:600]))
        self.untrace = llm.trace_passes(self.add, device_time=True)

    def add(self, record: PassRecord) -> None:
        self.records.append(record)
        kv = self.llm.stats()
        used = kv.num_blocks - kv.num_free_blocks
        if used >= self.peak_used:
            self.peak_used, self.peak_live = used, kv.num_computed_tokens

    def stop(self) -> None:
        self.untrace()
        self.knobs.runtime.jit_cache_hook = self.jit_hook

    def summary(self, wall_s: float) -> dict:
        """``launch_ms_median`` and the launch part of ``host_ms_per_step_mean`` are of passes launched in their
        own step (a pass enqueued ahead was launched while the pass before it ran)."""
        recs = self.records
        sched = [r.scheduled - r.start for r in recs]
        launch = [r.launched - r.scheduled for r in recs if not r.ahead] or [0.0]
        update = [r.updated - r.sampled for r in recs]
        gpu = np.array([np.nan if r.device_s is None else r.device_s for r in recs])
        kinds = {"decode graph": 0, "mixed graph": 0, "eager": 0}
        for r in recs:
            kinds[r.path.replace("-", " ")] += 1
        bs = self.llm.block_size
        return {"steps": len(recs), "passes": kinds, "enqueued_ahead": {
                    k: v - self.ahead_before[k] for k, v in self.llm.pipeline_stats.items()},
                "wall_s": wall_s, "gpu_s": float(np.nansum(gpu)),
                "exposed_host_frac": 1 - float(np.nansum(gpu)) / wall_s,
                "schedule_ms_median": float(np.median(sched)) * 1e3,
                "update_ms_median": float(np.median(update)) * 1e3,
                "launch_ms_median": float(np.median(launch)) * 1e3,
                "host_ms_per_step_mean": float(np.mean(sched) + np.mean(update) + np.mean(launch)) * 1e3,
                "gpu_ms_per_step_median": float(np.nanmedian(gpu)) * 1e3,
                "kv_peak_used_blocks": self.peak_used, "kv_blocks": self.llm.num_kv_blocks,
                "kv_live_tokens_at_peak": self.peak_live,
                "kv_occupancy_at_peak": self.peak_live / max(1, self.peak_used * bs), "jit_compiles": self.jit,
                # per pass: (tokens, decodes, decode context, GPU ms), to see where the time goes
                "per_pass": [(r.features.num_tokens, r.features.decode_tokens, r.features.decode_context,
                              round(float(g) * 1e3, 3)) for r, g in zip(recs, gpu)]}


def fits_seqs(llm: LLMEngine, reqs, cap: int = 256) -> int:
    """What a vLLM user does on seeing preemptions: cap max_num_seqs at the sequences whose mean final length
    (prompt + output) fits the KV cache. Beyond it the cache fills and requests are preempted and recomputed."""
    mean_len = float(np.mean([len(p) + o for p, o in reqs]))
    return int(min(cap, llm.num_kv_blocks * llm.block_size // mean_len))


def offline(llm: LLMEngine, reqs, ceil: dict) -> dict:
    # warm-up: a few short requests, so Triton's per-shape compilations stay out of the timed run
    for i in range(24):
        llm.add_request(reqs[i][0][:100 + 37 * i], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    while llm.has_unfinished():
        llm.step()
    torch.cuda.synchronize()
    inst = Instrument(llm)
    meter = energy_meter()
    try:
        with meter or contextlib.nullcontext():
            t0 = time.perf_counter()
            for prompt, out in reqs:
                llm.add_request(prompt, SamplingParams(max_tokens=out, temperature=0, ignore_eos=True))
            done = 0
            while llm.has_unfinished():
                done += sum(o.finished for o in llm.step())
            wall = time.perf_counter() - t0
    finally:
        inst.stop()
    prompt_tokens = sum(len(p) for p, _ in reqs)
    output_tokens = sum(o for _, o in reqs)
    res = inst.summary(wall)
    res.update(requests=len(reqs), finished=done, req_per_s=len(reqs) / wall, output_tok_per_s=output_tokens / wall,
               total_tok_per_s=(prompt_tokens + output_tokens) / wall, prompt_tokens=prompt_tokens,
               output_tokens=output_tokens, preemptions=llm.stats().num_preemptions,
               token_budget=llm.scheduler.token_budget, max_num_seqs=llm.scheduler.max_num_seqs)
    if meter:
        res["energy"] = energy_summary(meter, wall)
        if "energy" in ceil:
            res["energy"]["floor"] = energy_floor(llm, res["per_pass"], ceil["energy"])
    return res


def energy_floor(llm: LLMEngine, per_pass, costs: dict) -> dict:
    """The least time the offline run's work takes at the power limit, at this card's measured energy costs: every
    decode reads its context's KV, every pass reads the weights, every token costs its linear layers' FLOPs
    (attention FLOPs and the chunks' cached-prefix reads left out, so a lower bound)."""
    cfg = llm.model_config
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    weight_bytes, linear_params = model_bytes_and_flops(llm)
    passes = np.array(per_pass)
    joules = {"kv_read": passes[:, 2].sum() * kv_per_token / 1e9 * costs["read_j_per_gb"],
              "weight_reads": len(passes) * weight_bytes / 1e9 * costs["read_j_per_gb"],
              "linear_flops": 2 * linear_params * passes[:, 0].sum() / 1e12 * costs["matmul_j_per_tflop"]}
    joules = {k: float(v) for k, v in joules.items()}
    return {"joules_above_idle": joules, "seconds": sum(joules.values()) / (costs["power_limit_w"] - costs["idle_w"])}


# ---- transformers baseline --------------------------------------------------------------------------------
def hf_baseline(reqs, batches: int, batch_size: int = 64, seed: int = SEED, time_cap_s: float = 150) -> dict:
    import transformers

    from engine.presets import PRESETS

    preset = {k: v for k, v in PRESETS[MODEL].items() if k != "model_type"}
    config = transformers.LlamaConfig(**preset, pad_token_id=0)
    with torch.device(DEV):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa")
    random_init(model, seed)  # as the engine draws its own weights: on the GPU, from ``seed``
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(len(reqs))[:(batches + 1) * batch_size]
    out = {"transformers": transformers.__version__, "batch_size": batch_size, "batches": []}
    meter = energy_meter()

    def generate(batch):
        longest = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, _) in enumerate(batch):  # left padding, as generate expects for decoder-only models
            ids[i, longest - len(p):] = torch.tensor(p)
            mask[i, longest - len(p):] = 1
        new = max(o for _, o in batch)
        torch.cuda.synchronize()
        with meter or contextlib.nullcontext(), torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids.to(DEV), attention_mask=mask.to(DEV), max_new_tokens=new,
                                 do_sample=False)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        assert out.shape[1] == longest + new, "generate stopped early"
        return seconds, longest, new, meter.joules if meter else None

    generate([(reqs[0][0][:16], 4), (reqs[1][0][:9], 4)])  # warm-up
    start = time.perf_counter()
    # b == -1: one untimed full-size batch of other requests first, as the engine's run is warmed up. Without it
    # the first timed batch took 62 s and the second, alike in size, 41 s (H200, commit 360a305).
    for b in range(-1, batches):
        picked = order[b * batch_size:(b + 1) * batch_size] if b >= 0 else order[batches * batch_size:]
        batch = [reqs[i] for i in picked]
        row = {"requests": len(batch), "prompt_tokens": sum(len(p) for p, _ in batch),
               "output_tokens": sum(o for _, o in batch)}
        parts, size = [], len(batch)
        while not parts:  # 64 padded rows of KV may not fit an 80 GB card: halve until they do, same requests
            try:
                parts = [generate(batch[i:i + size]) for i in range(0, len(batch), size)]
            except torch.OutOfMemoryError:
                parts, size = [], size // 2
                gc.collect()
                torch.cuda.empty_cache()
        row.update(seconds=sum(p[0] for p in parts), padded_prompt=max(p[1] for p in parts),
                   generated_per_row=max(p[2] for p in parts), micro_batch=size)
        if meter:
            row["joules"] = sum(p[3] for p in parts)
        row["req_per_s"] = row["requests"] / row["seconds"]
        row["output_tok_per_s"] = row["output_tokens"] / row["seconds"]
        print(f"transformers batch {b}: {row}", flush=True)
        if b < 0:
            out["warmup_batch"] = row
            continue
        out["batches"].append(row)
        if time.perf_counter() - start > time_cap_s:
            break
    secs = sum(r["seconds"] for r in out["batches"])
    n = sum(r["requests"] for r in out["batches"])
    out["req_per_s"] = n / secs
    out["output_tok_per_s"] = sum(r["output_tokens"] for r in out["batches"]) / secs
    out["extrapolated_s_for_all"] = len(reqs) / out["req_per_s"]
    if meter:
        out["joules_per_request"] = sum(r["joules"] for r in out["batches"]) / n
        out["watts"] = sum(r["joules"] for r in out["batches"]) / secs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--hf-batches", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", "--token-budget", dest="token_budget", type=int, default=2048,
                    help="of the offline run (passes up to it)")
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="of the offline run; 0: as many as the KV cache holds at the workload's mean prompt + "
                         "output length (fits_seqs), at most 256")
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    run_metadata()  # the run's date: its start
    props = torch.cuda.get_device_properties(DEV)
    card = props.name
    result: dict = {"info": {"card_memory_GiB": props.total_memory / 2**30, "sms": props.multi_processor_count,
                             "model": MODEL, "dtype": "bfloat16"}}

    def dump():
        return write_results(args.out, "engine_gpu", result)

    result["ceilings"] = ceil = ceilings()
    torch.cuda.empty_cache()
    print(f"{card}: copy {ceil['copy_Bps'] / 1e12:.2f} TB/s, matmul {ceil['matmul_flops'] / 1e12:.0f} TFLOP/s "
          f"({ceil['matmul_flops_sustained'] / 1e12:.0f} sustained)", flush=True)
    t0 = time.perf_counter()
    llm = bench_engine(args.token_budget)
    result["startup"] = {"seconds": time.perf_counter() - t0, "num_kv_blocks": llm.num_kv_blocks,
                         "block_size": llm.block_size,
                         "graph_buckets": getattr(llm.runner.graphs, "buckets", None),
                         "mixed_graph_buckets": getattr(llm.runner.graphs, "mixed_buckets", None),
                         "allocated_GiB": torch.cuda.memory_allocated() / 2**30,
                         "reserved_GiB": torch.cuda.memory_reserved() / 2**30,
                         "free_GiB": torch.cuda.mem_get_info()[0] / 2**30}
    print(f"startup: {result['startup']}", flush=True)
    random_kv(llm)
    dump()
    rng = np.random.default_rng(SEED)
    try:
        result["micro"] = micro(llm, ceil, rng)
    except Exception as e:  # keep the rest of the run
        result["micro_error"] = repr(e)
        print(f"micro FAILED: {e!r}", flush=True)
    dump()
    reqs = workload(args.requests)
    llm.set_max_num_seqs(args.max_num_seqs or fits_seqs(llm, reqs))
    try:
        result["offline"] = offline(llm, reqs, ceil)
        print(f"offline: {result['offline']}", flush=True)
    except Exception as e:
        result["offline_error"] = repr(e)
        print(f"offline FAILED: {e!r}", flush=True)
    dump()
    llm.close()  # the cache, graphs and weights go before transformers loads
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    print(f"after freeing the engine: {torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated", flush=True)
    try:
        if args.hf_batches:
            result["transformers"] = hf_baseline(reqs, args.hf_batches)
    except Exception as e:
        result["transformers_error"] = repr(e)
        print(f"transformers FAILED: {e!r}", flush=True)
    path = dump()
    print_table({"meta": run_metadata(), **result})
    print(f"wrote {path}")


def print_table(r: dict) -> None:
    i, c, m, o, h = r["meta"], r["ceilings"], r.get("micro", {}), r.get("offline", {}), r.get("transformers", {})
    print(f"\n{i['card']} | torch {i['torch']} | triton {i['triton']} | transformers {i['transformers']} | "
          f"{i['date']} | copy {c['copy_Bps'] / 1e12:.2f} TB/s | matmul {c['matmul_flops'] / 1e12:.0f} TFLOP/s")
    rows = []
    for b, target in ((1, 0.85), (64, 0.75)):
        d = m.get(f"decode_b{b}_1k")
        if d:
            for key, name in (("engine_steps_pipelined", f"decode step, batch {b}, ~1k ctx (engine)"),
                              ("engine_steps_unpipelined", "  the same without passes enqueued ahead")):
                if key in d:
                    e = d[key]
                    rows.append((name, f"{e['step_ms']:.2f} ms vs floor {e['floor_ms']:.2f} ms",
                                 f"{e['frac_roofline']:.1%}", f">= {target:.0%}", e["frac_roofline"] >= target))
            rows.append(("  one pass, 1k ctx, runner.run", f"{d['gpu_ms']:.2f} ms vs floor {d['floor_ms']:.2f} ms",
                         f"{d['frac_roofline']:.1%}", f">= {target:.0%}", d["frac_roofline"] >= target))
            if "replay_only_ms" in d:
                rows.append(("  its graph alone, replayed back to back", f"{d['replay_only_ms']:.2f} ms",
                             f"{d['frac_roofline_replay_only']:.1%}", "", d["frac_roofline_replay_only"] >= target))
    p = m.get("prefill_2048")
    if p:  # like for like first: both from idle, both back to back (at the power limit)
        if "frac_matmul_from_idle" in p:
            rows.append(("prefill 2048, from idle vs matmul so", f"{np.median(p['from_idle_ms']):.1f} ms",
                         f"{p['frac_matmul_from_idle']:.1%}", ">= 75%", p["frac_matmul_from_idle"] >= 0.75))
        if "frac_matmul_sustained" in p:
            rows.append(("  back to back vs matmul so", f"{p['gpu_ms']:.1f} ms, {p['tflops']:.0f} TFLOP/s vs "
                         f"{c['matmul_flops_sustained'] / 1e12:.0f}", f"{p['frac_matmul_sustained']:.1%}", ">= 75%",
                         p["frac_matmul_sustained"] >= 0.75))
        rows.append(("  back to back vs matmul from idle", f"{p['tflops']:.0f} vs {c['matmul_flops'] / 1e12:.0f} "
                     "TFLOP/s", f"{p['frac_matmul']:.1%}", "", None))
        if "energy" in p:
            e = p["energy"]
            rows.append(("  its power, timed back to back", f"{e['watts']:.0f} W, SM {e['sm_mhz_median']:.0f} MHz",
                         f"{e['watts'] / e['power_limit_w']:.0%}", "of limit", None))
    for k, v in m.items():
        if k.startswith("mixed_768"):
            rows.append((f"SplitFuse 768 ({k[10:]} dec) vs prefill 768",
                         f"{v['gpu_ms']:.1f} vs {m['prefill_768']['gpu_ms']:.1f} ms", f"{v['vs_prefill_768']:+.1%}",
                         "within 15%", abs(v["vs_prefill_768"]) <= 0.15))
    if o and h:
        ratio = o["req_per_s"] / h["req_per_s"]
        rows.append(("offline 1000 req vs transformers", f"{o['req_per_s']:.2f} vs {h['req_per_s']:.3f} req/s",
                     f"{ratio:.1f}x", ">= 10x", ratio >= 10))
    if o:
        rows.append(("KV slots live at peak", f"{o['kv_live_tokens_at_peak']} / {o['kv_peak_used_blocks'] * 16}",
                     f"{o['kv_occupancy_at_peak']:.1%}", ">= 95%", o["kv_occupancy_at_peak"] >= 0.95))
    print(f"{'measure':<40} {'measured':<36} {'value':>8} {'target':>11}  met")
    for name, meas, val, target, ok in rows:
        print(f"{name:<40} {meas:<36} {val:>8} {target:>11}  {'' if ok is None else 'yes' if ok else 'NO'}")
    if o:
        print(f"offline: {o['wall_s']:.1f} s, {o['output_tok_per_s']:.0f} out tok/s, {o['total_tok_per_s']:.0f} "
              f"tok/s, {o['steps']} steps {o['passes']}, preemptions {o['preemptions']}; host per step "
              f"{o['host_ms_per_step_mean']:.2f} ms (sched {o['schedule_ms_median']:.2f}, launch "
              f"{o['launch_ms_median']:.2f}, update {o['update_ms_median']:.2f}) vs GPU "
              f"{o['gpu_ms_per_step_median']:.2f} ms median; exposed host {o['exposed_host_frac']:.1%} of wall")
    if o.get("energy"):
        e = o["energy"]
        print(f"offline energy: {e['joules'] / 1e3:.1f} kJ ({e['joules'] / o['requests']:.0f} J a request), mean "
              f"{e['watts']:.0f} W against a {e['power_limit_w']:.0f} W limit: at the limit it takes at least "
              f"{e['seconds_at_power_limit']:.1f} s; 10x transformers needs "
              f"{o['requests'] / (10 * h['req_per_s']) if h else float('nan'):.1f} s")
    if o.get("energy", {}).get("floor"):
        f = o["energy"]["floor"]
        print(f"offline energy floor: at least {f['seconds']:.1f} s at the power limit for its work's energy above idle"
              f" ({', '.join(f'{k} {v / 1e3:.1f} kJ' for k, v in f['joules_above_idle'].items())})")
    if "energy" in c:
        e = c["energy"]
        print(f"energy costs above idle ({e['idle_w']:.0f} W): read {e['read_j_per_gb']:.3f} J/GB (at {e['read_w']:.0f}"
              f" W), bf16 matmul {e['matmul_j_per_tflop']:.3f} J/TFLOP (at {e['matmul_w']:.0f} W)")
    if h.get("joules_per_request"):
        print(f"transformers energy: {h['joules_per_request']:.0f} J a request, mean {h['watts']:.0f} W")
    if h:
        print(f"transformers: {h['req_per_s']:.3f} req/s, {h['output_tok_per_s']:.0f} out tok/s over "
              f"{len(h['batches'])} batches; 1000 requests extrapolated to {h['extrapolated_s_for_all']:.0f} s")


if __name__ == "__main__":
    main()
