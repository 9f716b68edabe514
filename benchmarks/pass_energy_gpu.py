"""Energy per pass against the card's power limit: is a pass's time bound by the power cap?

Run from the repository root on a CUDA machine: ``python benchmarks/pass_energy_gpu.py [--out DIR]``. On the
random-weight Llama-2-7B-shaped model of ``engine_gpu.py`` (bf16, the engine's graphs, KV cache filled with random
values) each case runs back to back for ``--seconds`` while NVML's energy counter and a 20 ms sampler of power and
SM clock run: joules per pass, mean power against the enforced power limit, SM clock. A card held at its limit
cannot finish a pass faster than (joules per pass) / (power limit) unless the work itself costs less energy, so
the SplitFuse passes' energy, next to that of their parts (the chunk alone, the decodes alone), says whether
running the parts concurrently could pay. Cases interleave over ``--rounds`` rounds. Prints a table, writes
``pass_energy_<card>.json``. Needs nvidia-ml-py (pynvml).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_gpu as eg  # noqa: E402
from power import EnergyMeter, device_handle, idle_watts, power_limit_w  # noqa: E402

import engine.weights  # noqa: E402
from engine.llm import LLMEngine  # noqa: E402
from engine.policy import BatchPlan  # noqa: E402

WHOLE = {"prefill 768": {"chunk": 768}, "704 + 64 decodes @ 1k": {"chunk": 704, "decodes": 64},
         "704 + 64 decodes @ 256": {"chunk": 704, "decodes": 64, "ctx": 256},
         "752 + 16 decodes @ 1k": {"chunk": 752, "decodes": 16}, "decode b1 @ 1k": {"decodes": 1},
         "prefill 2048 (eager)": {"chunk": 2048}}
SPLIT = ("704 + 64 decodes @ 1k", "704 + 64 decodes @ 256", "752 + 16 decodes @ 1k")  # also timed as their parts


def parts(plan) -> tuple[BatchPlan, BatchPlan]:
    """A SplitFuse plan's decodes and its chunk, as two plans over the same requests."""
    decodes, chunk = BatchPlan(), BatchPlan()
    for i, (request, n) in enumerate(zip(plan.requests, plan.num_new_tokens)):
        (decodes if i < plan.num_decodes else chunk).add(request, n, decode=i < plan.num_decodes)
    return decodes, chunk


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
    x = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=eg.DEV).normal_()
    y = torch.empty_like(x)
    return {f"read {gib:g} GiB (sum)": (lambda: x.sum(), x.numel() * 2),
            f"copy {gib:g} GiB": (lambda: y.copy_(x), x.numel() * 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seconds", type=float, default=1.5, help="back-to-back run per case and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    handle = device_handle(torch.cuda.current_device())
    limit_w = power_limit_w(handle)
    engine.weights.random_init = eg.fast_random_init
    card = torch.cuda.get_device_properties(0).name
    memory_streams = streams()  # before the engine sizes its KV cache from the free memory
    llm = LLMEngine(eg.MODEL, dtype="bfloat16", device=eg.DEV, token_budget=2048, max_num_seqs=256,
                    gpu_memory_utilization=0.9, seed=eg.SEED)
    with torch.no_grad():
        llm.runner.kv_cache.normal_()
    passes = eg.Passes(llm, np.random.default_rng(eg.SEED))
    plans = {}
    for name, kw in WHOLE.items():
        plans[name] = passes.plan(**kw)
        if name in SPLIT:
            plans[f"{name}: its decodes alone"], plans[f"{name}: its chunk alone"] = parts(plans[name])
    res = {"card": card, "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "power_limit_w": limit_w, "idle_w": idle_watts(EnergyMeter(handle))}
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
        kv_read = kv_per_token * sum(r.num_computed_tokens + 1 for r in plan.requests[:plan.num_decodes])
        res["splits"][whole] = {"ms": med[whole]["ms"], "joules": med[whole]["joules"],
                                "parts_ms": sum(h["ms"] for h in halves), "parts_joules": joules,
                                "parts_joules_at_limit_ms": joules / limit_w * 1e3, "decodes_kv_bytes": kv_read,
                                "joules_over_prefill_768": med[whole]["joules"] - med["prefill 768"]["joules"]}
    tag = next((t for t in ("h200", "h100") if t in card.lower()), "gpu")
    Path(args.out, f"pass_energy_{tag}.json").write_text(json.dumps(res, indent=1))
    print(f"\n{card} | {res['date']} | power limit {limit_w:.0f} W, idle {res['idle_w']:.0f} W")
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
