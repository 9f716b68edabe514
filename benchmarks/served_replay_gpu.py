"""Served passes run again alone: is a served pass slower than the same pass swept, on the same card?

    python -m benchmarks.served_replay_gpu VALIDATE_DIR [--server splitfuse-2048] [--per-stratum 15]
                                           [--profile calibration/profiles/llama-2-7b-h200-bf16.json] [--out DIR]
                                           [--passes PASSES.jsonl]

``splitfuse validate`` traces every served pass with its shape (decode contexts; chunks as cached prefix, new
tokens, prompt tokens left) and its device seconds. This takes a seeded sample of those passes, stratified by path
and decode count, rebuilds each with the sweep's own scheduler set-up (``calibration.plans.build_plan``, a fresh
KV cache) on an engine configured as the server's was, and times it as one served step is timed: host schedule,
launch (inputs packed and kernels enqueued), run to the sampled ids, the device time between events around the
launch, and the scheduler's update. Served / replayed per stratum tells how much of the served passes' distance
from the profile is the serving (the engine loop beside an API process, passes back to back) and how much is the
card. Prints a table; writes ``served_replay_<card>.json`` with every pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import card_name, write_results
from calibration.plans import PassSpec, build_plan, release
from engine.config import EngineConfig
from engine.llm import LLMEngine
from engine.policy import PassFeatures, PolicyConfig, plan_features

DECODE_BINS = ((0, 0), (1, 16), (17, 64), (65, 128), (129, 100_000))
PHASES = ("sched_s", "launch_s", "run_s", "device_s", "update_s", "span_s")


def served_times(p: dict) -> dict:
    """A traced pass's phases (seconds): schedule, launch, launch to sampled ids, device, update, whole step."""
    return {"sched_s": p["scheduled"] - p["start"], "launch_s": p["launched"] - p["scheduled"],
            "run_s": p["sampled"] - p["scheduled"], "device_s": p.get("device_s"),
            "update_s": p["updated"] - p["sampled"], "span_s": p["updated"] - p["start"]}


def stratum(p: dict) -> str:
    """The pass's path and decode-count bin, e.g. "eager 17-64"."""
    lo, hi = next(b for b in DECODE_BINS if b[0] <= p["decode_tokens"] <= b[1])
    return f"{p['path']} {'0' if not hi else f'{lo}+' if hi == DECODE_BINS[-1][1] else f'{lo}-{hi}'}"


def sample(passes: list[dict], per_stratum: int, rng: np.random.Generator) -> list[dict]:
    """Up to ``per_stratum`` passes of each stratum, drawn at random: passes that waited for their sampled ids
    (a pass that samples nothing is not waited for) and ran as scheduled (not enqueued ahead), with a shape."""
    eligible = [p for p in passes if p.get("decode_contexts") is not None and not p["ahead"] and p["num_samples"]]
    groups: dict[str, list[dict]] = {}
    for p in eligible:
        groups.setdefault(stratum(p), []).append(p)
    picked = []
    for name in sorted(groups):
        group = groups[name]
        idx = rng.choice(len(group), size=min(per_stratum, len(group)), replace=False)
        picked += [group[i] for i in sorted(idx)]
    return picked


def read_passes(path: Path) -> list[dict]:
    """The passes of a JSONL file to replay; each needs its shape and a label (or, traced, its path)."""
    picked = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, p in enumerate(picked, start=1):
        missing = [k for k in ("decode_contexts", "chunks") if p.get(k) is None]
        if missing or not (p.get("label") or p.get("path")):
            raise SystemExit(f"{path}, line {i}: a pass to replay needs decode_contexts, chunks and a label or "
                             f"path; missing {', '.join(missing) or 'label'}")
    return picked


def replay(llm, spec: PassSpec, rng: np.random.Generator, repeats: int) -> dict:
    """``spec`` built as the sweep builds it and timed as a served step: medians of ``repeats`` runs after one
    warm-up."""
    sched, plan, sched_s = build_plan(spec, llm.num_kv_blocks, llm.block_size, rng, llm.model_config.vocab_size,
                                      llm.max_model_len)
    runner = llm.runner
    try:
        runner.run(plan)
        launch, run, device = [], [], []
        for _ in range(repeats):
            if llm.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            launched = runner.launch(plan, timed=True)
            t1 = time.perf_counter()
            sampled = launched.result()
            t2 = time.perf_counter()
            launch.append(t1 - t0)
            run.append(t2 - t0)
            device.append(launched.device_s())
        t0 = time.perf_counter()
        sched.update(plan, sampled, 0.0)
        update_s = time.perf_counter() - t0
    finally:
        release(sched)
    med = statistics.median
    return {"sched_s": sched_s, "launch_s": med(launch), "run_s": med(run),
            "device_s": None if None in device else med(device), "update_s": update_s,
            "span_s": sched_s + med(run) + update_s, "features": plan_features(plan)._asdict()}


def main() -> None:
    from sim.validate import read_traces, trace_files

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("validate_dir", type=Path)
    parser.add_argument("--server", default="splitfuse-2048", help="the traced server: SCHEDULER-TOKEN_BUDGET")
    parser.add_argument("--per-stratum", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-first", type=int, default=200, help="traced passes left out at the start (warm-up)")
    parser.add_argument("--profile", default=None, help="also price every pass with this profile")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=Path, default=None,
                        help="replay these passes (JSONL, each with decode_contexts, chunks and a label or path)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop replaying after this long and report the passes replayed so far")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    meta = json.loads((args.validate_dir / "meta.json").read_text())
    scheduler, budget = args.server.rsplit("-", 1)
    rng = np.random.default_rng(args.seed)
    if args.passes:
        picked = read_passes(args.passes)
        passes = picked
    else:
        passes = read_traces(trace_files(args.validate_dir, args.server, 1))[0][0][args.skip_first:]
        picked = sample(passes, args.per_stratum, rng)
    if not picked:
        parser.error(f"no traced pass of {args.server} in {args.validate_dir} has a shape to run again (traces "
                     "before commit bee5ad1 have none, and --skip-first may leave too few passes)")
    policy = PolicyConfig(scheduler=scheduler, max_num_batched_tokens=int(budget))
    llm = LLMEngine(EngineConfig(meta["model"], policy, **meta["engine_options"]))
    cost = None
    if args.profile:
        from calibration.profile import load_profile

        cost = load_profile(args.profile).model
    print(f"{len(picked)} of {len(passes)} traced passes; {llm.num_kv_blocks} KV blocks; "
          f"{card_name()}; started {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    rows = []
    began = time.monotonic()
    for p in picked:
        if args.max_seconds is not None and time.monotonic() - began > args.max_seconds:
            print(f"stopped after {args.max_seconds:.0f} s: {len(rows)} of {len(picked)} passes replayed")
            break
        spec = PassSpec("served", decode_contexts=tuple(p["decode_contexts"]),
                        chunks=tuple(tuple(c) for c in p["chunks"]))
        again = replay(llm, spec, rng, args.repeats)
        served = served_times(p) if "start" in p else dict.fromkeys(PHASES)
        features = again.pop("features")
        same = all(features[k] == p[k] for k in features if k in p)
        row = {"stratum": p.get("label") or stratum(p), "path": p.get("path"), "same_features": same, **features,
               **{f"served_{k}": v for k, v in served.items()}, **{f"replay_{k}": v for k, v in again.items()}}
        if cost is not None:
            row["predicted_s"] = cost.predict(PassFeatures(**features))
        rows.append(row)
    print(f"finished {time.strftime('%H:%M:%S', time.gmtime())} UTC; passes whose replay has other features: "
          f"{sum(not r['same_features'] for r in rows)}")
    header = f"{'stratum':<22} {'n':>3} " + " ".join(f"{k[:-2] + ' s/r':>11}" for k in PHASES)
    if cost is not None:
        header += f" {'served/pred':>11} {'replay/pred':>11}"
    print(header)
    for name in sorted({r["stratum"] for r in rows}):
        group = [r for r in rows if r["stratum"] == name]
        line = f"{name:<22} {len(group):>3} "
        for k in PHASES:
            ratios = [r[f"served_{k}"] / r[f"replay_{k}"] for r in group
                      if r[f"served_{k}"] is not None and r[f"replay_{k}"]]
            line += f" {statistics.median(ratios):>10.3f}" if ratios else f" {'-':>10}"
        if cost is not None:
            served = [r["served_span_s"] / r["predicted_s"] for r in group if r["served_span_s"] is not None]
            line += f" {statistics.median(served):>11.3f}" if served else f" {'-':>11}"
            line += f" {statistics.median(r['replay_span_s'] / r['predicted_s'] for r in group):>11.3f}"
        print(line)
    path = write_results(args.out, "served_replay", rows, validate_dir=str(args.validate_dir), server=args.server,
                         validate_meta=meta, profile=args.profile, repeats=args.repeats)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
