"""Passes of a closed-loop run in the engine's own process against the card's profile: is the serving path or the
engine's own state why served decode steps run slower than the profile predicts?

    python -m benchmarks.engine_passes_gpu [--out DIR] [--model llama-2-7b] [--profile NAME] [--concurrency 8,16,24]
                                           [--prompt-len normal:2600:0.3] [--output-len normal:128:0.3]

Served long-context decode steps (``splitfuse serve``, traced by ``splitfuse validate``) take 5-11% longer than
the profile's sweep timed them (``calibration/VALIDATION.md``, fourth round). This runs the same kind of work
without the server: ``LLMEngine.step`` in a loop, ``--concurrency`` requests of the long mix in flight at a time
(``sim.validate.MIXES["long"]``: prompts N(2600, 30%), outputs N(128, 30%); ``--prompt-len`` and
``--output-len`` take any length spec), random token ids, temperature 1 as the benchmark client sends), every
pass traced (``LLMEngine.trace_passes``) and its span from schedule to update set against the profile's swept
model for its features. The free-block queue ages as requests come and go, so the table splits each run into its
first and last third. Prints a table per path and decode batch; writes ``engine_passes_<card>.json``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.common import card_tag, number_list, write_results
from calibration.profile import load_profile
from engine.config import EngineConfig
from engine.llm import LLMEngine, PassRecord
from engine.policy import PolicyConfig, SamplingParams
from sim.validate import MIXES
from sim.workload import LengthDist, parse_length

BUCKETS = (0, 4, 8, 16, 24, 32, 48, 64, 128, 256)


def length_spec(text: str) -> LengthDist:
    try:
        return parse_length(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def closed_loop(llm: LLMEngine, concurrency: int, num_requests: int, rng: np.random.Generator,
                prompt_len: LengthDist, output_len: LengthDist) -> None:
    """Run ``num_requests`` requests ``concurrency`` at a time (a new one as each finishes)."""
    outputs = np.minimum(output_len.sample(rng, num_requests), llm.max_model_len // 4)
    prompts = np.minimum(prompt_len.sample(rng, num_requests), llm.max_model_len - outputs)
    vocab = llm.model_config.vocab_size
    sent = 0

    def send() -> None:
        nonlocal sent
        llm.add_request(rng.integers(3, vocab, int(prompts[sent])).tolist(),
                        SamplingParams(max_tokens=int(outputs[sent]), ignore_eos=True, temperature=1.0))
        sent += 1

    for _ in range(min(concurrency, num_requests)):
        send()
    while llm.has_unfinished():
        for out in llm.step():
            if out.finished and sent < num_requests:
                send()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-2-7b")
    parser.add_argument("--profile", default=None, help="default: <model>-<card> as shipped")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--concurrency", type=number_list(), default=[8, 16, 24])
    parser.add_argument("--requests", type=int, default=96, help="requests per concurrency")
    parser.add_argument("--prompt-len", type=length_spec, default=MIXES["long"][0], help="a length spec")
    parser.add_argument("--output-len", type=length_spec, default=MIXES["long"][1], help="a length spec")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    prompt_len, output_len = args.prompt_len, args.output_len  # argparse parses the string defaults too
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    llm = LLMEngine(EngineConfig(args.model, PolicyConfig(), dtype=dtype, device=args.device, seed=args.seed))
    profile = load_profile(args.profile or f"{args.model}-{card_tag()}")
    model = profile.model  # the swept passes alone: what a pass's span from schedule to update compares with
    rng = np.random.default_rng(args.seed)
    closed_loop(llm, 2, 4, rng, prompt_len, output_len)  # compile and warm up
    records: list[PassRecord] = []
    llm.trace_passes(records.append)
    rows = []
    print(f"{llm.num_kv_blocks} KV blocks; profile {profile.source}")
    print(f"{'conc':>4} {'third':>5} {'path':>12} {'batch':>9} {'passes':>6} {'ctx':>6} {'ms':>7} {'pred ms':>7} "
          f"{'sum ratio':>9}")
    for concurrency in args.concurrency:
        records.clear()
        closed_loop(llm, concurrency, args.requests, rng, prompt_len, output_len)
        passes = [{"third": min(2, 3 * i // len(records)), "path": r.path, "span_s": r.updated - r.start,
                   "predicted_s": model.predict(r.features), **r.features._asdict()} for i, r in enumerate(records)]
        for third in (0, 2):
            for path in sorted({p["path"] for p in passes}):
                for lo, hi in zip(BUCKETS, BUCKETS[1:]):
                    sel = [p for p in passes if p["third"] == third and p["path"] == path and lo < p["num_seqs"] <= hi]
                    if not sel:
                        continue
                    span = sum(p["span_s"] for p in sel)
                    pred = sum(p["predicted_s"] for p in sel)
                    ctx = sum(p["decode_context"] for p in sel) / max(1, sum(p["decode_tokens"] for p in sel))
                    rows.append({"concurrency": concurrency, "third": third, "path": path, "batch": f"{lo + 1}-{hi}",
                                 "passes": len(sel), "mean_decode_context": ctx,
                                 "median_span_s": float(np.median([p["span_s"] for p in sel])),
                                 "median_predicted_s": float(np.median([p["predicted_s"] for p in sel])),
                                 "span_over_predicted": span / pred})
                    r = rows[-1]
                    print(f"{concurrency:>4} {third + 1:>5} {path:>12} {r['batch']:>9} {len(sel):>6} {ctx:>6.0f} "
                          f"{1e3 * r['median_span_s']:>7.3f} {1e3 * r['median_predicted_s']:>7.3f} "
                          f"{r['span_over_predicted']:>9.3f}", flush=True)
    path = write_results(args.out, "engine_passes", rows, model=args.model, profile=str(profile.source),
                         requests=args.requests, prompt_len=str(prompt_len), output_len=str(output_len))
    print(f"wrote {path}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
