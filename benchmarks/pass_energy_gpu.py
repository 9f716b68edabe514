"""Energy per pass against the card's power limit: is a pass's time bound by the power cap?

Run from the repository root on a CUDA machine: ``python -m benchmarks.pass_energy_gpu [--out DIR]``. On the
random-weight Llama-2-7B-shaped model of ``engine_gpu`` (bf16, the engine's graphs, KV cache filled with random
values) each case runs back to back for ``--seconds`` while NVML's energy counter and a 20 ms sampler of power and
SM clock run: joules per pass, mean power against the enforced power limit, SM clock. A card held at its limit
cannot finish a pass faster than (joules per pass) / (power limit) unless the work itself costs less energy, so
the SplitFuse passes' energy, next to that of their parts (the chunk alone, the decodes alone), says whether
running the parts concurrently could pay. Cases interleave over ``--rounds`` rounds. Prints a table, writes
``pass_energy_<card>.json``. Needs nvidia-ml-py (pynvml).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from benchmarks.common import run_metadata, write_results
from benchmarks.engine_gpu import DEV, SEED, Passes, bench_engine, random_kv
from calibration.power import EnergyMeter, device_handle, idle_watts, power_limit_w
from engine.policy import BatchPlan, plan_features

WHOLE = {"prefill 768": {"chunk": 768}, "704 + 64 decodes @ 1k": {"chunk": 704, "decodes": 64},
         "704 + 64 decodes @ 256": {"chunk": 704, "decodes": 64, "ctx": 256},
         "752 + 16 decodes @ 1k": {"chunk": 752, "decodes": 16}, "decode b1 @ 1k": {"decodes": 1},
         "prefill 2048 (eager)": {"chunk": 2048}}
SPLIT = ("704 + 64 decodes @ 1k", "704 + 64 decodes @ 256", "752 + 16 decodes @ 1k")  # also timed as their parts


def parts(plan: BatchPlan) -> tuple[BatchPlan, BatchPlan]:
    """A SplitFuse plan's decodes and its chunks, as two plans over the same requests (the plan has not run, so
    each chunk still starts at its request's computed tokens)."""
    d = plan.num_decodes
    decodes = BatchPlan.of_decodes(plan.requests[:d], plan.start_positions[:d], [])
    chunks = BatchPlan()
    for request, n in zip(plan.requests[d:], plan.num_new_tokens[d:]):
        chunks.add_chunk(request, n)
    return decodes, chunks


def run_case(launch, handle, seconds: float) -> dict:
    """``launch()`` (one pass or kernel, enqueued) back to back for about ``seconds``, then synchronized: ms and
    joules per launch, power, clock."""
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    launch()
    torch.cuda.synchronize()
    n = max(10, int(seconds / max(time.perf_counter() - t0, 1e-4)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with EnergyMeter(handle) as meter:
        start.record()
        for _ in range(n):
            launch()
        end.record()
        torch.cuda.synchronize()
    ms = start.elapsed_time(end) / n
    row = {"launches": n, "ms": ms, **meter.summary(ms * n / 1e3)}
    row["joules"] /= n
    return row


def streams(gib: float = 1.0) -> dict:
    """Plain memory streams, for the energy of moving a byte: a read-only reduction and a copy."""
    x = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=DEV).normal_()
    y = torch.empty_like(x)
    return {f"read {gib:g} GiB (sum)": (lambda: x.sum(), x.numel() * 2),
            f"copy {gib:g} GiB": (lambda: y.copy_(x), x.numel() * 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    ap.add_argument("--seconds", type=float, default=1.5, help="back-to-back run per case and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    handle = device_handle(torch.cuda.current_device())
    limit_w = power_limit_w(handle)
    memory_streams = streams()  # before the engine sizes its KV cache from the free memory
    llm = bench_engine()
    random_kv(llm)
    passes = Passes(llm, np.random.default_rng(SEED))
    plans = {}
    for name, kw in WHOLE.items():
        plans[name] = passes.plan(**kw)
        if name in SPLIT:
            plans[f"{name}: its decodes alone"], plans[f"{name}: its chunk alone"] = parts(plans[name])
    res = {"power_limit_w": limit_w, "idle_w": idle_watts(EnergyMeter(handle))}
    cases = {name: (lambda plan=plan: llm.runner.launch(plan), None) for name, plan in plans.items()}
    cases.update(memory_streams)
    res["rounds"] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (launch, nbytes) in cases.items():
            row = run_case(launch, handle, args.seconds)
            if nbytes:
                row.update(bytes=nbytes, joules_per_gb=row["joules"] / nbytes * 1e9)
            res["rounds"][name].append(row)
            print(name, json.dumps(row), flush=True)
    med = {name: {k: float(np.median([r[k] for r in rows])) for k in ("ms", "joules", "watts", "sm_mhz_median")}
           for name, rows in res["rounds"].items()}
    res["median"] = med
    runner = llm.runner
    kv_per_token = runner.kv_cache.nbytes / (runner.num_kv_blocks * runner.block_size)
    res["splits"] = {}
    for whole in SPLIT:
        halves = [med[f"{whole}: its {p} alone"] for p in ("decodes", "chunk")]
        joules = sum(h["joules"] for h in halves)
        plan = plans[whole]
        kv_read = kv_per_token * plan_features(plan).decode_context
        res["splits"][whole] = {"ms": med[whole]["ms"], "joules": med[whole]["joules"],
                                "parts_ms": sum(h["ms"] for h in halves), "parts_joules": joules,
                                "parts_joules_at_limit_ms": joules / limit_w * 1e3, "decodes_kv_bytes": kv_read,
                                "joules_over_prefill_768": med[whole]["joules"] - med["prefill 768"]["joules"]}
    path = write_results(args.out, "pass_energy", res)
    print(f"wrote {path}")
    meta = run_metadata()
    print(f"\n{meta['card']} | {meta['date']} | power limit {limit_w:.0f} W, idle {res['idle_w']:.0f} W")
    print(f"{'case':<44} {'ms':>7} {'J':>7} {'W':>5} {'of limit':>8} {'SM MHz':>7} {'J / limit, ms':>13}")
    for name, m in med.items():
        print(f"{name:<44} {m['ms']:>7.2f} {m['joules']:>7.2f} {m['watts']:>5.0f} {m['watts'] / limit_w:>8.0%} "
              f"{m['sm_mhz_median']:>7.0f} {m['joules'] / limit_w * 1e3:>13.2f}")
    for name, (_, nbytes) in cases.items():
        if nbytes:
            per_gb = float(np.median([r["joules_per_gb"] for r in res["rounds"][name]]))
            print(f"{name}: {per_gb:.3f} J per GB moved (read + written), "
                  f"{nbytes / med[name]['ms'] / 1e6:.0f} GB/s")
    for whole, s in res["splits"].items():
        print(f"{whole}: {s['ms']:.2f} ms, {s['joules']:.2f} J ({s['joules_over_prefill_768']:+.2f} J over the "
              f"prefill of 768, for {s['decodes_kv_bytes'] / 1e9:.1f} GB of KV read); its parts alone "
              f"{s['parts_ms']:.2f} ms, {s['parts_joules']:.2f} J, at the power limit "
              f"{s['parts_joules_at_limit_ms']:.2f} ms")


if __name__ == "__main__":
    main()
