"""The server's engine loop after each pass, with ``RequestOutput``s (the loop before ``step_deltas``) and with deltas.

    python -m benchmarks.serving_loop_gpu [--model llama-2-7b] [--requests 128] [--max-tokens 300] [--repeats 3]

Builds the engine as the server's engine process does (random weights, CUDA graphs, start-up heap frozen) and runs the
same batch (short prompts, sampled outputs of ``--max-tokens``, no EOS: a decode batch that fills to ``--requests``
sequences and drains) through two loops, alternating, ``--repeats`` times each. Both send each pass's items, with the
engine's stats, over a pipe to a process that reads them, as the server's engine process does:

- ``outputs``: ``LLMEngine.step`` (a ``RequestOutput`` per sampled request, its tokens copied), then the items built
  from them, as ``engine.server.engine_core`` did before;
- ``deltas``: ``LLMEngine.step_deltas``, sent as they are (the loop now).

Per bin of sampled entries: the median outputs phase (the scheduler's update to the step's end), send phase (to the
pipe's write returning) and loop (update to the next pass's start), us; and each run's decode rate (tokens/s). Prints
a table; writes ``serving_loop_<card>.json``. Runs on the CPU too (tiny-llama, float32) for a quick look.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np
import torch

from benchmarks.common import card_name, number_list, write_results
from engine.llm import LLMEngine
from engine.policy.sampling_params import SamplingParams
from engine.server.engine_core import engine_stats
from engine.server.heap import freeze_startup_heap


def items_from_outputs(outputs) -> list[tuple]:
    """What the engine loop sent per pass before ``step_deltas``: items built from ``RequestOutput``s."""
    items = []
    for output in outputs:
        m = output.metrics
        queue_time = None if m is None or m.first_scheduled_time is None else m.first_scheduled_time - m.arrival_time
        items.append((output.request_id, output.new_token_ids, output.finished, output.outputs[0].finish_reason,
                      queue_time))
    return items


LOOPS = {"outputs": lambda engine: items_from_outputs(engine.step()), "deltas": lambda engine: engine.step_deltas()}


def _drain(conn) -> None:
    try:
        while True:
            conn.recv()
    except EOFError:
        pass


def run(engine: LLMEngine, loop: str, conn, requests: int, max_tokens: int, seed: int) -> dict:
    """One batch through ``loop``: per pass (sampled entries, start, updated, end, sent) and the run's decode rate."""
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    for i in range(requests):
        engine.add_request(rng.integers(3, vocab, 32).tolist(),
                           SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + i, ignore_eos=True))
    records, sent = [], []
    untrace = engine.trace_passes(records.append)
    step = LOOPS[loop]
    busy_s, start = 0.0, time.perf_counter()
    try:
        while engine.has_unfinished():
            t0 = time.perf_counter()
            items = step(engine)
            busy_s += time.perf_counter() - t0
            conn.send(("out", items, [len(items)], engine_stats(engine, busy_s)))
            sent.append(time.perf_counter())
    finally:
        wall = time.perf_counter() - start
        untrace()
    passes = [(r.num_outputs, r.start, r.updated, r.end, s) for r, s in zip(records, sent)]
    return {"loop": loop, "wall_s": wall, "tokens_per_s": requests * max_tokens / wall, "passes": passes}


def summary(results: list[dict], bins: list[int]) -> list[dict]:
    """Per loop and bin of sampled entries: median outputs, send and loop phases (us) over every run's passes."""
    rows = []
    for loop in LOOPS:
        phases = []
        for result in (r for r in results if r["loop"] == loop):
            p = np.asarray(result["passes"], dtype=float)
            # entries, outputs phase, send phase, loop (to the next pass's start)
            phases.append(np.column_stack([p[:-1, 0], p[:-1, 3] - p[:-1, 2], p[:-1, 4] - p[:-1, 3],
                                           p[1:, 1] - p[:-1, 2]]))
        phases = np.concatenate(phases)
        for lo, hi in zip([1] + [b + 1 for b in bins[:-1]], bins):
            part = phases[(phases[:, 0] >= lo) & (phases[:, 0] <= hi)]
            if len(part):
                rows.append({"loop": loop, "entries": f"{lo}-{hi}", "passes": len(part),
                             "outputs_us": 1e6 * np.median(part[:, 1]), "send_us": 1e6 * np.median(part[:, 2]),
                             "loop_us": 1e6 * np.median(part[:, 3]),
                             "loop_per_entry_us": 1e6 * np.median(part[:, 3] / part[:, 0])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default llama-2-7b on CUDA, tiny-llama on the CPU")
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bins", type=number_list(), default=[32, 64, 96, 128])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for name in ("requests", "max_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.bins or args.bins != sorted(set(args.bins)) or args.bins[0] < 1:
        parser.error(f"--bins: increasing edges of at least 1, got {args.bins}")

    cuda = torch.cuda.is_available()
    model = args.model or ("llama-2-7b" if cuda else "tiny-llama")
    engine = LLMEngine(model, dtype="bfloat16" if cuda else "float32", device="cuda" if cuda else "cpu",
                       max_num_seqs=args.requests, seed=args.seed)
    freeze_startup_heap()
    ctx = multiprocessing.get_context("spawn")
    reader, conn = ctx.Pipe(duplex=False)
    drain = ctx.Process(target=_drain, args=(reader,), daemon=True)
    drain.start()
    reader.close()
    for loop in LOOPS:  # every batch size once (the sampler's kernels compile per shape), graphs warm
        run(engine, loop, conn, args.requests, 8, args.seed)
    results = [run(engine, loop, conn, args.requests, args.max_tokens, args.seed)
               for i in range(args.repeats) for loop in (LOOPS if i % 2 == 0 else reversed(LOOPS))]
    conn.close()
    drain.join(10)
    rows = summary(results, args.bins)
    print(f"{card_name()}, {model}, {args.requests} requests of {args.max_tokens} sampled tokens, "
          f"{args.repeats} runs per loop")
    print(f"{'loop':<8} {'entries':>8} {'passes':>6} {'outputs us':>10} {'send us':>8} {'loop us':>8} "
          f"{'loop us/entry':>13}")
    for r in rows:
        print(f"{r['loop']:<8} {r['entries']:>8} {r['passes']:>6} {r['outputs_us']:>10.0f} {r['send_us']:>8.0f} "
              f"{r['loop_us']:>8.0f} {r['loop_per_entry_us']:>13.2f}")
    rates = {loop: [r["tokens_per_s"] for r in results if r["loop"] == loop] for loop in LOOPS}
    for loop, values in rates.items():
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{loop:<8} decode rate {np.median(values):,.0f} tokens/s, the median of runs {runs}")
    print(f"deltas / outputs: {np.median(rates['deltas']) / np.median(rates['outputs']):.3f} of the decode rate")
    path = write_results(args.out, "serving_loop", {"model": model, "requests": args.requests,
                                                    "max_tokens": args.max_tokens, "repeats": args.repeats,
                                                    "table": rows, "rates": rates, "runs": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
