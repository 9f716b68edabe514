"""Decode steps on a fresh KV cache against the same steps on an aged one: does block scatter cost time?

    python -m benchmarks.kv_layout_gpu [--out DIR] [--model llama-2-7b] [--batches 4,16,17,24] [--contexts 650,2700]
                                       [--spreads 0,0.3]

A profile's sweep times each pass on a fresh cache, where a sequence's KV blocks are consecutive. A server's free
queue is FIFO (for prefix-cache eviction), so after minutes of serving a request's blocks lie scattered over the
whole cache (``calibration.plans.age_kv_cache``; on an H200 a 169-block sequence then spans 6 runs across the 111
GB cache). Served decode steps at long context run 5-11% slower than the H200 profile predicts
(``calibration/VALIDATION.md``, fourth round); this measures whether the layout is why. Each case is one decode
batch (contexts spread around the mean: ``--spreads`` 0.3 is 0.7-1.3x), built twice with the same contexts, on a
fresh and on an aged cache, timed as the sweep times passes (``calibration.sweep.PointTimer``: the engine's
graphs, wall clock with a device sync), alternating over ``--rounds`` rounds. Prints a table; writes
``kv_layout_<card>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import numpy as np
import torch

from benchmarks.common import number_list, write_results
from calibration.plans import PassSpec, build_plan, release
from calibration.sweep import PointTimer
from engine.config import EngineConfig
from engine.llm import LLMEngine
from engine.policy import PolicyConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", type=number_list(), default=[4, 9, 16, 17, 24, 32, 64])
    parser.add_argument("--contexts", type=number_list(), default=[650, 2700], help="mean decode contexts")
    parser.add_argument("--spreads", type=number_list(float), default=[0.3],
                        help="half-widths of the contexts' spread around each mean")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="default: as memory allows")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    # graphs for decode batches up to the largest case; a small token budget keeps the mixed graphs few
    policy = PolicyConfig(max_num_batched_tokens=64, max_num_seqs=max(args.batches), block_size=16)
    llm = LLMEngine(EngineConfig(args.model, policy, dtype=dtype, device=args.device, seed=0,
                                 num_kv_blocks=args.num_kv_blocks))
    timer = PointTimer(llm.runner, llm.device, min_repeats=10, max_repeats=30, target_s=0.2)
    rng = np.random.default_rng(0)
    rows = []
    card = torch.cuda.get_device_name() if llm.device.type == "cuda" else "cpu"
    print(f"{llm.num_kv_blocks} KV blocks of {llm.block_size} tokens on {card}")
    print(f"{'batch':>5} {'mean ctx':>8} {'spread':>6} {'fresh ms':>9} {'aged ms':>8} {'aged/fresh':>10}")
    for batch, mean, spread in itertools.product(args.batches, args.contexts, args.spreads):
        contexts = tuple(int(c) for c in np.clip(mean * rng.uniform(1 - spread, 1 + spread, batch), 1,
                                                 llm.max_model_len - 2))
        spec = PassSpec("decode", decode_contexts=contexts)
        times = {False: [], True: []}
        for _ in range(args.rounds):
            for aged in (False, True):
                sched, plan, _ = build_plan(spec, llm.num_kv_blocks, llm.block_size, rng,
                                            llm.model_config.vocab_size, llm.max_model_len, aged_kv=aged)
                walls, _, _ = timer.time(plan)
                times[aged].append(statistics.median(walls))
                release(sched)
        fresh, aged = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"batch": batch, "mean_context": mean, "spread": spread, "fresh_s": fresh, "aged_s": aged,
                     "aged_over_fresh": aged / fresh, "fresh_rounds_s": times[False],
                     "aged_rounds_s": times[True]})
        print(f"{batch:>5} {mean:>8} {spread:>6.2f} {1e3 * fresh:>9.3f} {1e3 * aged:>8.3f} {aged / fresh:>10.3f}",
              flush=True)
    path = write_results(args.out, "kv_layout", rows, model=args.model, num_kv_blocks=llm.num_kv_blocks,
                         rounds=args.rounds)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
