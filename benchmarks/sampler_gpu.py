"""What the sampler costs on the card: drawing in vocabulary order (rows with neither top-k nor top-p, the default)
against sorting each row (what a top-k / top-p row does, and what every sampled row did up to commit 3b9a74b), and
greedy rows, side by side in one run.

    python -m benchmarks.sampler_gpu [--out DIR] [--vocabs 32000,128256] [--rows 1,8,32,64,128,256]

bf16 logits [rows, vocab] on the card, one sampler call per repeat waited for, the median host time of 30 repeats
(its host work and its kernels; in the engine the host work runs while the pass's graph does). Sorting is forced
with ``top_k = vocab - 1``: the same sort and kernels as any top-k row. What the engine's decode steps save is
``calibration.sampler_saved``'s to measure. Prints a table; writes ``sampler_gpu_<card>.json``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import number_list, write_results
from engine.policy import Request, SamplingParams
from engine.sampler import Sampler

REPEATS = 30


def variants(vocab: int) -> dict[str, SamplingParams]:
    return {"sorted": SamplingParams(top_k=vocab - 1), "vocab-order": SamplingParams(),
            "greedy": SamplingParams(temperature=0.0)}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_sampler(vocab: int, rows: int, params: SamplingParams, device: str) -> float:
    """Median seconds of one sampler call (host time, waited for) on bf16 logits [rows, vocab]."""
    sampler = Sampler(0)
    logits = torch.randn(rows, vocab, device=device).to(torch.bfloat16)
    requests = [Request(str(i), [1, 2, 3], params) for i in range(rows)]
    times = []
    for i in range(REPEATS + 5):
        sync(device)
        t = time.perf_counter()
        sampler(logits, requests)
        sync(device)
        if i >= 5:
            times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabs", type=number_list(), default=[32000, 128256])
    parser.add_argument("--rows", type=number_list(), default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    print(f"{'vocab':>6} {'rows':>5} {'sorted ms':>9} {'vocab-order ms':>14} {'greedy ms':>9} "
          f"{'vocab-order / sorted':>20}")
    for vocab in args.vocabs:
        for n in args.rows:
            ms = {name: 1e3 * time_sampler(vocab, n, p, args.device) for name, p in variants(vocab).items()}
            ratio = ms["vocab-order"] / ms["sorted"]
            rows.append({"vocab": vocab, "rows": n, **{f"{k}_ms": v for k, v in ms.items()},
                         "vocab_order_over_sorted": ratio})
            print(f"{vocab:>6} {n:>5} {ms['sorted']:>9.3f} {ms['vocab-order']:>14.3f} {ms['greedy']:>9.3f} "
                  f"{ratio:>20.3f}", flush=True)
    path = write_results(args.out, "sampler_gpu", rows, repeats=REPEATS)
    print(f"wrote {path}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
