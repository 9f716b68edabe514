"""Prompt-chunk attention: launch configs of ``kernels/triton_attention.py`` against torch's flash SDPA.

``python -m benchmarks.prefill_attention_gpu [--out DIR]`` on a CUDA machine. For each case (Llama-2-7B 32/32
heads and Llama-3-8B 32/8, head dim 128, bf16, block size 16, blocks scattered at random) it checks the
chunk launch against ``kernels.reference`` (fp32) once, times every config with ``do_bench`` (median) and prints
TFLOP/s of causal attention (QK^T and PV of the visible pairs only). SDPA (flash, causal, contiguous K/V, no
paging) on the fresh 2,048-token prompt is the yardstick of what this card gives. Writes
``prefill_attention_gpu_<card>.json``.
"""

from __future__ import annotations

import argparse
import functools
import os

import torch
import triton
import triton.testing

from benchmarks.common import run_metadata, write_results
from kernels import reference as ref
from kernels import triton_attention as ta

CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 4, 3), (128, 64, 4, 2),
           (64, 128, 4, 2)]
CASES = {  # name: (heads, kv_heads, [(chunk, prefix), ...])
    "llama2 1x2048 fresh": (32, 32, [(2048, 0)]),
    "llama2 512 chunk, 1k prefix": (32, 32, [(512, 1024)]),
    "llama2 4x2048, 2k prefix": (32, 32, [(2048, 2048)] * 4),
    "llama2 1848 chunk + 200 decodes @1k": (32, 32, [(1848, 0)] + [(1, 1023)] * 200),
    "llama3 1x2048 fresh": (32, 8, [(2048, 0)]),
}


def make(heads, kv_heads, pairs, dev="cuda", dtype=torch.bfloat16, d=128, bs=16):
    # decodes first, as the scheduler orders a plan
    pairs = sorted(pairs, key=lambda p: p[0] != 1)
    ctxs = [c + p for c, p in pairs]
    nb = [triton.cdiv(c, bs) for c in ctxs]
    perm = torch.randperm(sum(nb), device=dev, dtype=torch.int32)
    tables = torch.zeros(len(ctxs), max(nb), dtype=torch.int32, device=dev)
    used = 0
    for i, n in enumerate(nb):
        tables[i, :n] = perm[used:used + n]
        used += n
    kc = torch.randn(sum(nb), bs, kv_heads, d, device=dev, dtype=dtype)
    vc = torch.randn_like(kc)
    qlens = [c for c, _ in pairs]
    q = torch.randn(sum(qlens), heads, d, device=dev, dtype=dtype)
    qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    flops = sum(4.0 * heads * d * sum(range(p + 1, p + c + 1)) for c, p in pairs if c > 1)
    return (q, kc, vc, tables, torch.tensor(ctxs, dtype=torch.int32, device=dev), qsl), flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    args = ap.parse_args()
    torch.manual_seed(0)
    scale = 128 ** -0.5
    rows = []
    for name, (h, hkv, pairs) in CASES.items():
        inputs, flops = make(h, hkv, pairs)
        chunk_rows = inputs[5][-1].item() - sum(1 for c, _ in pairs if c == 1)
        expect = ref.paged_attention(*[t.float() if t.is_floating_point() else t for t in inputs], scale)
        for cfg in CONFIGS:
            c = ta.AttentionConfig(*cfg, qlen_filter=2)
            out = torch.zeros_like(inputs[0])
            try:
                ta.paged_attention_with(*inputs, scale, c, out=out)
                tail = slice(out.shape[0] - chunk_rows, None)
                err = ((out[tail].float() - expect[tail]).norm() / expect[tail].norm()).item()
                ms = triton.testing.do_bench(functools.partial(ta.paged_attention_with, *inputs, scale, c, out=out),
                                             warmup=25, rep=100, return_mode="median")
            except Exception as e:  # a config that does not compile (shared memory) is a row, not a crash
                rows.append((name, cfg, float("nan"), float("nan"), repr(e)[:80]))
                continue
            rows.append((name, cfg, ms, flops / ms / 1e9, f"rel err {err:.1e}"))
        ms = triton.testing.do_bench(functools.partial(ta.paged_attention, *inputs, scale), warmup=25, rep=100,
                                     return_mode="median")
        rows.append((name, "default (2 launches)", ms, flops / ms / 1e9, ""))
        if "fresh" in name:
            n = pairs[0][0]
            q = torch.randn(1, h, n, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, hkv, n, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            fn = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, k, v, is_causal=True,
                                   enable_gqa=hkv != h)
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            rows.append((name, "torch SDPA causal (contiguous)", ms, flops / ms / 1e9, ""))
    print(f"wrote {write_results(args.out, 'prefill_attention_gpu', rows)}")
    meta = run_metadata()
    print(f"{meta['card']} triton {meta['triton']} torch {meta['torch']}")
    for name, cfg, ms, tf, note in rows:
        print(f"{name:38s} {str(cfg):32s} {ms * 1e3:9.1f} us {tf:7.0f} TFLOP/s  {note}")


if __name__ == "__main__":
    main()
