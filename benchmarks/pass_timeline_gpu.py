"""Where one pass's GPU time goes: kernels vs the gaps between them, eager vs replayed as a CUDA graph.

``python -m benchmarks.pass_timeline_gpu [--out DIR] [--graph-tokens 2048]`` on a CUDA machine. Builds the
engine of ``engine_gpu`` (random-weight Llama-2-7B, bf16) with pass graphs up to ``--graph-tokens``, then for
each plan times the pass with CUDA events (``engine_gpu.time_pass``) eagerly and through its graph, and traces
one pass of each with torch.profiler: kernel time per kind, the span from the first kernel's start to the last
kernel's end, the idle time inside it and the largest gaps with the kernel before them. Prints a table; writes
``pass_timeline_<card>.json``. ``--graph-programs``, ``--pdl``, ``--fused``, ``--mixed-decode`` and ``--overlap``
instead time passes with the graphs recaptured under each setting and write ``pass_timeline_<setting>_<card>.json``
(experiments: ``benchmarks/results/`` keeps only the timelines).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import torch

import kernels
from benchmarks.common import run_metadata, write_results
from benchmarks.engine_gpu import SEED, Passes, bench_engine, kernel_kind, random_kv, time_pass
from engine.llm import LLMEngine

SPLITFUSE = {"prefill 768": {"chunk": 768}, "752 + 16 decodes @ 1k": {"chunk": 752, "decodes": 16},
             "704 + 64 decodes @ 256": {"chunk": 704, "decodes": 64, "ctx": 256},
             "704 + 64 decodes @ 1k": {"chunk": 704, "decodes": 64}}
DECODES = {"decode b1 @ 1k": {"decodes": 1}, "decode b16 @ 1k": {"decodes": 16}, "decode b64 @ 1k": {"decodes": 64}}
PLANS = {"prefill 2048": {"chunk": 2048}, "prefill 1024": {"chunk": 1024}, "1000 + 24 decodes": {"chunk": 1000,
         "decodes": 24}, "prefill 512": {"chunk": 512}, "1800 + 48 decodes": {"chunk": 1800, "decodes": 48}}


def trace_pass(llm: LLMEngine, plan, use_graphs: bool = True) -> dict:
    """One pass under torch.profiler: kernels per kind, span, idle time and the five largest gaps."""
    from torch.profiler import ProfilerActivity, profile

    llm.runner.run(plan, use_graphs=use_graphs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.runner.run(plan, use_graphs=use_graphs)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kern = sorted((e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"), key=lambda e: e["ts"])
    if not kern:
        return {"error": "no kernel events"}
    kinds: dict[str, float] = {}
    for e in kern:
        kind = kernel_kind(e["name"])
        kinds[kind] = kinds.get(kind, 0.0) + e["dur"] / 1e3
    gaps = [(kern[i + 1]["ts"] - (kern[i]["ts"] + kern[i]["dur"]), kern[i]["name"][:50], kern[i + 1]["name"][:50])
            for i in range(len(kern) - 1)]
    span = (kern[-1]["ts"] + kern[-1]["dur"] - kern[0]["ts"]) / 1e3
    busy = sum(e["dur"] for e in kern) / 1e3
    pos = [g for g in gaps if g[0] > 0]
    return {"kernels": len(kern), "kernel_ms": round(busy, 4), "span_ms": round(span, 4),
            "idle_ms": round(sum(g[0] for g in pos) / 1e3, 4), "gaps_over_10us": sum(g[0] > 10 for g in pos),
            "kinds_ms": {k: round(v, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "largest_gaps_us": [(round(g[0], 1), g[1], g[2]) for g in sorted(pos, reverse=True)[:5]],
            "gemms": sorted({e["name"][:70] for e in kern if kernel_kind(e["name"]) == "gemm"})}


def sweep_recaptured(llm: LLMEngine, passes, settings: dict[str, dict], plans: dict[str, dict], max_batch: int = 0,
                     mixed_buckets: tuple[int, ...] | None = None) -> dict:
    """Replay ms (median of 3 interleaved rounds of 5) of ``plans`` with the graphs recaptured under each setting
    (``name: {kernel option: value}``, ``kernels.KernelOptions``' names); the settings alternate within each round,
    so drift falls on all. ``max_batch``: capture decode graphs only up to it (and mixed graphs of at most that many
    sequences); ``mixed_buckets``: the mixed-pass buckets to capture (default: the engine's)."""
    runner = llm.runner
    max_batch, max_tokens = max_batch or runner.graphs.max_batch, runner.graphs.mixed_buckets[-1]
    built = {name: passes.plan(**kw) for name, kw in plans.items()}
    times = {s: {name: [] for name in built} for s in settings}
    for _ in range(3):
        for setting, changes in settings.items():
            with kernels.use_kernel_options(**changes):
                runner.rebuild_graphs(max_batch, max_tokens, mixed_buckets)  # one set of graphs alive at a time
                for name, plan in built.items():
                    times[setting][name].append(time_pass(llm, plan, repeats=5)["gpu_ms"])
    passes.release()
    out = {s: {name: float(np.median(t)) for name, t in per.items()} for s, per in times.items()}
    for s, per in out.items():
        print(f"{s}: {per}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    ap.add_argument("--graph-tokens", type=int, default=2048, help="largest pass graph (the engine's default: 1024)")
    ap.add_argument("--graph-programs", default="", help="comma-separated graph_programs_per_sm values: instead of "
                    "the timelines, recapture the graphs with each and time the SplitFuse passes of engine_gpu.py")
    ap.add_argument("--only", default="", help="trace only the plans whose name contains this")
    ap.add_argument("--pdl", action="store_true", help="instead of the timelines, recapture the graphs with and "
                    "without programmatic dependent launch (and the fused rotary + KV write) and time decode and "
                    "SplitFuse passes")
    ap.add_argument("--fused", action="store_true", help="instead of the timelines, recapture the graphs with and "
                    "without the gate/up projection fused with its activation (kernel option fused_mlp) and time "
                    "decode and SplitFuse passes")
    ap.add_argument("--mixed-decode", default="", help="comma-separated BLOCK_N/warps/stages of the decode launch of "
                    "mixed batches: instead of the timelines, recapture the 768-token pass graphs with each and time "
                    "the SplitFuse passes")
    ap.add_argument("--overlap", default="", help="comma-separated BLOCK_N/warps/stages of the decode launch of "
                    "mixed batches: instead of the timelines, recapture the 768-token pass graphs with each, with the "
                    "chunks' launch beside the decodes' (kernel option overlap_chunks) and after it, and time "
                    "the SplitFuse passes")
    args = ap.parse_args()
    llm = bench_engine()
    if args.graph_tokens != llm.runner.graphs.mixed_buckets[-1]:  # the engine's own graphs stop at 1,024 tokens
        llm.runner.rebuild_graphs(llm.runner.graphs.max_batch, args.graph_tokens)
    random_kv(llm)
    passes = Passes(llm, np.random.default_rng(SEED))
    res = {"graph_tokens": args.graph_tokens, "mixed_buckets": llm.runner.graphs.mixed_buckets, "plans": {}}
    recapture = args.graph_programs or args.pdl or args.mixed_decode or args.fused or args.overlap
    timelines = {} if recapture else {**PLANS, **DECODES}
    for name, kw in ((n, kw) for n, kw in timelines.items() if args.only in n):
        plan = passes.plan(**kw)
        row = {"graph": llm.runner.graphs.key(plan)}
        modes = ("eager", "replay") if row["graph"] is not None else ("eager",)
        times = {m: [] for m in modes}
        for _ in range(3):  # interleaved rounds: clock and power drift fall on both modes alike
            for mode in modes:
                times[mode].append(time_pass(llm, plan, repeats=5, use_graphs=mode == "replay")["gpu_ms"])
        for mode in modes:
            row[mode] = {"gpu_ms": float(np.median(times[mode])), "rounds_ms": times[mode]}
            row[f"{mode}_trace"] = trace_pass(llm, plan, use_graphs=mode == "replay")
        passes.release()
        res["plans"][name] = row
        print(name, json.dumps(row, default=str), flush=True)
    if args.graph_programs:
        res["graph_programs"] = sweep_recaptured(llm, passes, {f"{v} per SM": {"graph_programs_per_sm": int(v)}
                                                               for v in args.graph_programs.split(",")}, SPLITFUSE)
    if args.pdl:
        settings = {"PDL off": {"pdl": False, "fused_rotary": True},
                    "PDL on, unfused": {"pdl": True, "fused_rotary": False},
                    "PDL on": {"pdl": True, "fused_rotary": True}}
        res["pdl"] = sweep_recaptured(llm, passes, settings, {**DECODES, **SPLITFUSE})
    if args.fused:
        settings = {"MLP unfused": {"fused_mlp": False}, "MLP fused": {"fused_mlp": True}}
        res["fused"] = sweep_recaptured(llm, passes, settings, {**DECODES, **SPLITFUSE})
    if args.mixed_decode or args.overlap:
        overlaps = (False, True) if args.overlap else (kernels.kernel_options().overlap_chunks,)
        settings = {f"{v}{' overlapped' if o and args.overlap else ''}": {
            "mixed_decode": tuple(map(int, v.split("/"))), "overlap_chunks": o}
            for v in (args.overlap or args.mixed_decode).split(",") for o in overlaps}
        res["overlap" if args.overlap else "mixed_decode"] = sweep_recaptured(llm, passes, settings, SPLITFUSE,
                                                                              max_batch=80, mixed_buckets=(768,))
    swept = [key for key in ("graph_programs", "pdl", "fused", "mixed_decode", "overlap") if key in res]
    path = write_results(args.out, "_".join(["pass_timeline", *swept]), res)
    print(f"wrote {path}")
    if not res["plans"]:
        return
    meta = run_metadata()
    print(f"\n{meta['card']} | {meta['date']}")
    print(f"{'plan':<20} {'mode':<7} {'event ms':>9} {'kernels ms':>11} {'span ms':>8} {'idle ms':>8} {'n':>5}")
    for name, row in res["plans"].items():
        for mode in ("eager", "replay"):
            if mode in row:
                t = row[f"{mode}_trace"]
                print(f"{name:<20} {mode:<7} {row[mode]['gpu_ms']:>9.2f} {t.get('kernel_ms', 0):>11.2f} "
                      f"{t.get('span_ms', 0):>8.2f} {t.get('idle_ms', 0):>8.2f} {t.get('kernels', 0):>5}")


if __name__ == "__main__":
    main()
