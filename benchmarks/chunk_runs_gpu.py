"""A lone prompt's chunk passes as the engine serves them, against the same passes waited for one by one and the
profile's prediction, back to back and after the card idled: why a lone prompt beats its prediction.

    python -m benchmarks.chunk_runs_gpu [--out DIR] [--model llama-2-7b] [--profile NAME ...]
                                        [--prompts 1000,2600,3800] [--token-budget 768] [--repeats 5] [--gaps 0,0.5]

A prompt longer than the token budget runs as chunk passes that sample nothing and a last one that samples its
first token. The engine does not wait for a pass that samples nothing, so the next pass is scheduled and enqueued
while the GPU still runs it (``LLMEngine.step``). Served FastGen cells with one client ran such runs at 0.86-0.89
of the profile's prediction (``calibration/VALIDATION.md``, ninth round). Each prompt (random token ids, one output
token, temperature 1 as the benchmark client sends) runs ``--repeats`` times after each idle gap of ``--gaps``
(seconds the card idles before the run: 0 runs them back to back, the card drawing its full power) in three ways:
- ``served``: ``step()`` in a loop, as the server runs it; the run spans the first pass's start to the last one's
  update (``LLMEngine.trace_passes``);
- ``synced``: the same, with ``torch.cuda.synchronize()`` after every step, so each pass is timed alone as a
  profile's sweep times it (step entry to the sync);
- ``device``: traced with ``device_time``, each pass's GPU seconds between CUDA events.
Prints, per gap and prompt, the median run (ms) of each way and each way over the sum of the passes' predictions
of every ``--profile`` (its swept model, no serving section); writes ``chunk_runs_<card>.json`` with each run's
start (Unix seconds), to read beside a clock log (``nvidia-smi --query-gpu=timestamp,clocks.sm ... -lms 50``).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch

from benchmarks.common import card_tag, number_list, write_results
from calibration.profile import load_profile
from engine.config import EngineConfig
from engine.llm import LLMEngine, PassRecord
from engine.policy import PolicyConfig, SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def one_run(llm: LLMEngine, prompt: list[int], way: str) -> tuple[float, list[PassRecord]]:
    """Run ``prompt`` to its first token ``way`` ("served", "synced" or "device"): the run's seconds (for "synced",
    its steps' seconds up to each sync, summed) and its passes' records."""
    records: list[PassRecord] = []
    untrace = llm.trace_passes(records.append, device_time=way == "device")
    steps = []
    try:
        llm.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True, temperature=1.0))
        sync()
        while llm.has_unfinished():
            t0 = time.perf_counter()
            llm.step()
            if way == "synced":
                sync()
                steps.append(time.perf_counter() - t0)
    finally:
        untrace()
    run = sum(steps) if way == "synced" else records[-1].updated - records[0].start
    return run, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--profile", action="append", default=None,
                        help="profiles to predict with (repeatable; default: <model>-<card> as shipped)")
    parser.add_argument("--prompts", type=number_list(), default=[1000, 2600, 3800], help="prompt lengths")
    parser.add_argument("--token-budget", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gaps", type=number_list(float), default=[0.0, 0.5], help="idle seconds before each run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (cpu only for smoke runs: no device way)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.repeats < 1 or min(args.gaps, default=-1) < 0 or min(args.prompts, default=0) < 1:
        parser.error("--repeats must be at least 1, --gaps non-negative seconds, --prompts positive token counts")
    cuda = args.device == "cuda"
    llm = LLMEngine(EngineConfig(args.model, PolicyConfig(token_budget=args.token_budget),
                                 dtype="bfloat16" if cuda else "float32", device=args.device, seed=args.seed))
    profiles = {name: load_profile(name) for name in args.profile or [f"{args.model}-{card_tag()}"]}
    rng = np.random.default_rng(args.seed)
    vocab = llm.model_config.vocab_size
    ways = ("served", "synced", "device") if cuda else ("served", "synced")
    for way in ways:  # compile and warm up
        one_run(llm, rng.integers(3, vocab, max(args.prompts)).tolist(), way)
    rows = []
    header = f"{'gap s':>5} {'prompt':>6} {'passes':>6} " + " ".join(f"{w + ' ms':>10}" for w in ways)
    header += "".join(f" {'pred ms':>8} " + " ".join(f"{w[:6] + '/pred':>11}" for w in ways) for _ in profiles)
    print(f"{llm.num_kv_blocks} KV blocks, token budget {args.token_budget}; profiles "
          + ", ".join(str(p.source) for p in profiles.values()))
    print(header)
    for gap, length in itertools.product(args.gaps, args.prompts):
        runs, starts = {w: [] for w in ways}, {w: [] for w in ways}
        passes = None
        for _ in range(args.repeats):
            for way in ways:  # interleaved, so that drifts of the card's clock touch every way alike
                time.sleep(gap)
                starts[way].append(time.time())  # to read the card's clock log beside
                run, records = one_run(llm, rng.integers(3, vocab, length).tolist(), way)
                runs[way].append(run if way != "device" else sum(r.device_s for r in records))
                passes = records
        row = {"gap_s": gap, "prompt_tokens": length, "passes": len(passes), "paths": sorted({r.path for r in passes}),
               **{f"{w}_s": float(np.median(v)) for w, v in runs.items()},
               **{f"{w}_runs_s": v for w, v in runs.items()}, **{f"{w}_starts": v for w, v in starts.items()}}
        line = f"{gap:>5.2f} {length:>6} {len(passes):>6} " + " ".join(f"{1e3 * row[f'{w}_s']:>10.2f}" for w in ways)
        for name, profile in profiles.items():
            predicted = sum(profile.model.predict(r.features) for r in passes)
            row.setdefault("predicted_s", {})[name] = predicted
            line += f" {1e3 * predicted:>8.2f} " + " ".join(f"{row[f'{w}_s'] / predicted:>11.3f}" for w in ways)
        rows.append(row)
        print(line, flush=True)
    path = write_results(args.out, "chunk_runs", rows, model=args.model, token_budget=args.token_budget,
                         repeats=args.repeats)
    print(f"wrote {path}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
