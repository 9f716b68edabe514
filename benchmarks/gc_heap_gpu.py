"""The engine loop with Python's garbage collector walking its start-up heap, and with that heap frozen.

    python -m benchmarks.gc_heap_gpu [--model llama-2-7b] [--requests 256] [--max-tokens 400] [--out DIR]

Builds the engine as the server's engine process does (random weights, CUDA graphs), then runs the same batch of
requests (short prompts, long outputs, greedy, no EOS: a decode batch that fills to ``--requests`` sequences and
drains) three times: with the collector as Python starts it, after ``engine.server.heap.freeze_startup_heap``, and
unfrozen again (so that the order of the runs is not what differs). For each run: every pass's outputs phase (from
the scheduler's update to the step's return: one output object per sampled request) and whole step by sampled
entries, each collection of each generation and its pause, and the run's wall time. Prints a table; writes
``gc_heap_<card>.json``.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import torch

from benchmarks.common import card_name, write_results
from engine.llm import LLMEngine
from engine.policy.sampling_params import SamplingParams
from engine.server.heap import freeze_startup_heap, unfreeze_heap

ENTRY_BINS = ((1, 64), (65, 128), (129, 192), (193, 256))


class Collections:
    """Each collection the collector makes while installed: (generation, seconds)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.rows.append((info["generation"], time.perf_counter() - self._start))


def run(engine: LLMEngine, requests: int, max_tokens: int, seed: int) -> dict:
    """One batch through ``engine.step``: its passes (sampled entries, outputs phase, step) and collections."""
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    for _ in range(requests):
        engine.add_request(rng.integers(3, vocab, 32).tolist(),
                           SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    passes, collections = [], Collections()
    untrace = engine.trace_passes(passes.append)
    gc.callbacks.append(collections)
    start = time.perf_counter()
    try:
        while engine.has_unfinished():
            engine.step()
    finally:
        wall = time.perf_counter() - start
        gc.callbacks.remove(collections)
        untrace()
    return {"wall_s": wall, "passes": [(p.num_outputs, p.end - p.updated, p.end - p.start) for p in passes],
            "collections": collections.rows}


def summary(name: str, result: dict) -> list[dict]:
    """Rows of the table: per bin of sampled entries, the outputs phase and step (median, mean, max, ms)."""
    passes = np.asarray(result["passes"], dtype=float)
    rows = []
    for lo, hi in ENTRY_BINS:
        part = passes[(passes[:, 0] >= lo) & (passes[:, 0] <= hi)]
        if len(part):
            rows.append({"run": name, "entries": f"{lo}-{hi}", "passes": len(part),
                         "outputs_p50_ms": 1e3 * np.median(part[:, 1]), "outputs_mean_ms": 1e3 * part[:, 1].mean(),
                         "outputs_max_ms": 1e3 * part[:, 1].max(), "step_mean_ms": 1e3 * part[:, 2].mean()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    engine = LLMEngine(args.model, dtype="bfloat16" if cuda else "float32", device="cuda" if cuda else "cpu",
                       max_num_seqs=args.requests, seed=args.seed)
    run(engine, 16, 8, args.seed)  # first passes of each shape: kernels compile, graphs warm
    results, rows = {}, []
    for name, setting in (("collected", None), ("frozen", freeze_startup_heap), ("collected again", unfreeze_heap)):
        if setting is not None:
            setting()
        results[name] = run(engine, args.requests, args.max_tokens, args.seed)
        rows += summary(name, results[name])
    print(f"{card_name()}, {args.model}, {args.requests} requests of {args.max_tokens} tokens")
    print(f"{'run':<16} {'entries':>8} {'passes':>6} {'outputs p50':>11} {'mean':>8} {'max':>8} {'step mean':>9}  (ms)")
    for r in rows:
        print(f"{r['run']:<16} {r['entries']:>8} {r['passes']:>6} {r['outputs_p50_ms']:>11.3f} "
              f"{r['outputs_mean_ms']:>8.3f} {r['outputs_max_ms']:>8.1f} {r['step_mean_ms']:>9.3f}")
    print(f"{'run':<16} {'wall s':>7} {'gen 0':>6} {'gen 1':>6} {'gen 2':>6} {'gen 2 pause ms (sum, max)':>26}")
    for name, result in results.items():
        c = np.asarray(result["collections"] or [(0, 0.0)], dtype=float)
        counts = [int(((c[:, 0] == g) & (c[:, 1] > 0)).sum()) for g in range(3)]
        g2 = c[c[:, 0] == 2, 1]
        print(f"{name:<16} {result['wall_s']:>7.2f} {counts[0]:>6} {counts[1]:>6} {counts[2]:>6} "
              f"{1e3 * g2.sum():>13.1f} {1e3 * (g2.max() if len(g2) else 0):>12.1f}")
    path = write_results(args.out, "gc_heap", {"model": args.model, "requests": args.requests,
                                               "max_tokens": args.max_tokens, "table": rows, "runs": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
