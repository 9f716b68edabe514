"""Check the Triton kernels against the references at full model sizes on a GPU, then time them.

Run on a CUDA machine from the repository root: ``python -m benchmarks.kernels_gpu [--sweep] [--out DIR]``.
It measures its own ceilings in the same run (device-to-device copy bandwidth counting bytes read plus
written; a large bf16 matmul), checks every kernel on fresh random bf16 data (Llama-2-7B: 32 heads of 128;
Llama-3-8B: 32 query / 8 KV heads), times each with ``triton.testing.do_bench`` (median) over a CUDA graph
that holds several input sets (so host overhead and L2 hits stay out), prints a table and writes
``kernels_gpu_<card>.json``. ``--sweep`` also times alternative launch configs of the attention kernel (in the same
file);
``--sweep-long`` instead times only decode batches of 1-4 programs per SM at long contexts, unsplit and split with a
least tiles per split (``kernels_gpu_long_<card>.json``).
Imports only torch, triton and this repository's ``kernels`` (no simpy/plotly on the GPU machine).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

import torch
import triton

from benchmarks.common import bench_graph, run_metadata, write_results
from kernels import reference as ref
from kernels import triton_attention as ta
from kernels import triton_norm, triton_rotary

DEV = "cuda"
DT = torch.bfloat16
MODELS = {"llama2-7b": (32, 32, 128), "llama3-8b": (32, 8, 128)}  # heads, kv_heads, head_dim
L2_SAFE_BYTES = 256 << 20  # input sets per graph until this many bytes are touched: well over the L2


def rel_err(out: torch.Tensor, expect: torch.Tensor) -> float:
    if out.isnan().any():
        return float("nan")
    return ((out.double() - expect.double()).norm() / expect.double().norm()).item()


def ceilings() -> tuple[float, float]:
    """(copy bandwidth, bf16 matmul rate), measured as the calibration sweep measures them."""
    from calibration.sweep import device_ceilings

    c = device_ceilings(torch.device(DEV))
    return c["copy_bandwidth_Bps"], c["matmul_flops"]


class Batch:
    """``sets`` ragged batches of one shape over one paged cache, each over its own random blocks."""

    def __init__(self, q_lens, ctxs, model, block_size=16, sets=1):
        heads, kv_heads, head_dim = MODELS[model]
        self.model, self.q_lens, self.ctxs, self.heads, self.head_dim = model, q_lens, ctxs, heads, head_dim
        n_blocks = [triton.cdiv(c, block_size) for c in ctxs]
        need = sum(n_blocks)
        self.kv_bytes = sum(ctxs) * kv_heads * head_dim * 2 * DT.itemsize
        total = need * sets
        self.k_cache = torch.randn(total, block_size, kv_heads, head_dim, device=DEV, dtype=DT)
        self.v_cache = torch.randn_like(self.k_cache)
        perm = torch.randperm(total, device=DEV, dtype=torch.int32)
        self.sets = []
        qsl = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEV)
        cl = torch.tensor(ctxs, dtype=torch.int32, device=DEV)
        for s in range(sets):
            tables = torch.zeros(len(ctxs), max(n_blocks), dtype=torch.int32, device=DEV)
            used = s * need
            for b, n in enumerate(n_blocks):
                tables[b, :n] = perm[used:used + n]
                used += n
            q = torch.randn(sum(q_lens), heads, head_dim, device=DEV, dtype=DT)
            self.sets.append((q, self.k_cache, self.v_cache, tables, cl, qsl))
        self.scale = head_dim ** -0.5

    @staticmethod
    def sets_for(ctxs, model):
        _, kv_heads, head_dim = MODELS[model]
        per_set = sum(ctxs) * kv_heads * head_dim * 4
        return max(1, min(32, math.ceil(L2_SAFE_BYTES / per_set)))

    def flops(self) -> float:
        """Attention FLOPs (QK^T and PV) of the causal batch."""
        keys = sum(sum(range(c - ql + 1, c + 1)) for ql, c in zip(self.q_lens, self.ctxs))
        return 4.0 * self.heads * self.head_dim * keys

    def reference(self):
        return ref.paged_attention(*self.sets[0], self.scale)

    def run(self, cfg=None, s=0, out=None):
        if cfg is None:
            return ta.paged_attention(*self.sets[s], self.scale)
        return ta.paged_attention_with(*self.sets[s], self.scale, cfg, out=out)

    def time(self, cfg=None) -> float:
        return bench_graph([lambda s=s: self.run(cfg, s) for s in range(len(self.sets))])


def make(q_lens, ctxs, model, block_size=16):
    return Batch(q_lens, ctxs, model, block_size, Batch.sets_for(ctxs, model))


def check_attention(rows, b: Batch, name, cfgs=None):
    expect = b.reference()
    for label, cfg in (cfgs or {"default": None}).items():
        out = torch.full_like(expect, float("nan"))
        if isinstance(cfg, tuple):  # decodes and chunks in two launches
            for c in cfg:
                b.run(c, out=out)
        else:
            out.copy_(b.run(cfg))
        rows.append({"check": f"attention {name} {label}", "rel_err": rel_err(out, expect),
                     "max_abs_err": (out.float() - expect.float()).abs().max().item()})


def sweep_long_decodes(copy_bw: float) -> list[dict]:
    """Decode batches whose B x Hkv programs give the SMs 1-4 programs each, at 1k-8k contexts (and one batch
    of mixed contexts): the default launch, the unsplit one, and KV splits of at least ``min_split_tiles`` tiles."""
    rows = []
    cases = [("llama3-8b", b, [c] * b) for b in (17, 32, 64) for c in (1024, 4096, 8192)]
    cases += [("llama2-7b", b, [c] * b) for b in (6, 12) for c in (1024, 4096, 8192)]
    cases += [("llama3-8b", 32, [8192] * 8 + [1024] * 24)]
    cfgs = {"unsplit": ta.AttentionConfig(16, 64, 4, 2)}
    cfgs.update({f"split {s} min {m} st {st}": ta.AttentionConfig(16, 64, 4, st, num_splits=s, min_split_tiles=m)
                 for s in (2, 4) for m in (16, 32) for st in (1, 2)})
    for model, batch, ctxs in cases:
        b = make([1] * batch, ctxs, model)
        expect = b.reference()
        (default,) = ta.default_config(*b.sets[0][:2], b.sets[0][3], b.sets[0][4])
        for label, cfg in {"default": default, **cfgs}.items():
            err = rel_err(b.run(cfg), expect)
            us = b.time(cfg)
            rows.append({"model": model, "batch": batch, "ctx": f"{ctxs[0]}" if len(set(ctxs)) == 1 else "mixed",
                         "cfg": label, "launch": vars(cfg), "us": us, "rel_err": err,
                         "frac_copy_bw": b.kv_bytes / (us * 1e-6) / copy_bw})
            print(f"long {model} b{batch} ctx {rows[-1]['ctx']:>5} {label:<22} {us:8.1f} us "
                  f"{rows[-1]['frac_copy_bw']:6.1%} err {err:.1e}", flush=True)
        del b
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time alternative attention launch configs")
    ap.add_argument("--sweep-long", action="store_true", help="only time long-context decode launch configs")
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    args = ap.parse_args()
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    props = torch.cuda.get_device_properties(0)
    card = props.name
    copy_bw, mm_flops = ceilings()
    print(f"{card}: copy {copy_bw / 1e12:.2f} TB/s (read+write), bf16 matmul {mm_flops / 1e12:.0f} TFLOP/s",
          flush=True)
    checks, timings, sweep = [], [], []
    if args.sweep_long:
        path = write_results(args.out, "kernels_gpu_long", sweep_long_decodes(copy_bw), copy_bw_Bps=copy_bw)
        print(f"wrote {path}")
        return

    def dump():
        return write_results(args.out, "kernels_gpu", {
            "sms": props.multi_processor_count, "copy_bw_Bps": copy_bw, "matmul_bf16_flops": mm_flops,
            "checks": checks, "timings": timings, "sweep": sweep})

    # ---- correctness at full size -----------------------------------------------------------------------
    for model in MODELS:
        mixed = Batch([1] * 64 + [512], [1024] * 64 + [1536], model)
        check_attention(checks, mixed, f"{model} 64x1k decodes + 512 chunk (1k prefix)", {
            "default": None,
            "two launches": (ta.AttentionConfig(16, 64, 4, 3, qlen_filter=1),
                             ta.AttentionConfig(64, 64, 4, 2, qlen_filter=2))})
        check_attention(checks, Batch([1], [4000], model), f"{model} 1 decode 4000 ctx (split)")
        check_attention(checks, Batch([1] * 8 + [300, 37], [777] * 8 + [1100, 37], model, block_size=32),
                        f"{model} block 32 ragged")
    heads, kv_heads, head_dim = MODELS["llama3-8b"]
    tokens = 4096
    k = torch.randn(tokens, kv_heads, head_dim, device=DEV, dtype=DT)
    v = torch.randn_like(k)
    slots = torch.randperm(tokens * 2, device=DEV)[:tokens]
    slots[::7] = -1
    kc = torch.randn(tokens * 2 // 16, 16, kv_heads, head_dim, device=DEV, dtype=DT)
    vc = torch.randn_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    ref.write_kv(k, v, kc, vc, slots)
    ta.write_kv(k, v, kc2, vc2, slots)
    checks.append({"check": "write_kv llama3-8b 4096 tokens", "rel_err": float(not (torch.equal(kc, kc2)
                                                                                      and torch.equal(vc, vc2)))})
    hidden = 4096
    x, res = torch.randn(tokens, hidden, device=DEV, dtype=DT), torch.randn(tokens, hidden, device=DEV, dtype=DT)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(DT)
    (o, r), (o_ref, r_ref) = triton_norm.rms_norm(x, w, 1e-5, res), ref.rms_norm(x, w, 1e-5, res)
    checks.append({"check": "rms_norm 4096x4096", "rel_err": rel_err(o, o_ref),
                   "residual_equal": torch.equal(r, r_ref)})
    inv = 1.0 / (500000 ** (torch.arange(0, head_dim, 2, device=DEV).float() / head_dim))
    ang = torch.outer(torch.arange(8192, device=DEV).float(), inv)
    cs = torch.cat((ang.cos(), ang.sin()), -1)
    qr, kr = torch.randn(tokens, heads, head_dim, device=DEV, dtype=DT), k.clone()
    pos = torch.randint(0, 8192, (tokens,), device=DEV)
    (qo, ko), (qo_ref, ko_ref) = triton_rotary.rotary_embedding(qr, kr, pos, cs), ref.rotary_embedding(qr, kr, pos, cs)
    checks.append({"check": "rotary llama3-8b 4096 tokens", "rel_err": max(rel_err(qo, qo_ref), rel_err(ko, ko_ref))})
    for c in checks:
        print(f"check {c['check']:<70} rel_err {c['rel_err']:.2e}", flush=True)

    # ---- timings ------------------------------------------------------------------------------------------
    def add(kind, name, us, nbytes=None, flops=None, **extra):
        row = {"kernel": kind, "case": name, "us": us, **extra}
        if nbytes:
            row["GB/s"] = nbytes / us / 1e3
            row["frac_copy_bw"] = nbytes / (us * 1e-6) / copy_bw
        if flops:
            row["TFLOP/s"] = flops / us / 1e6
            row["frac_matmul"] = flops / (us * 1e-6) / mm_flops
        timings.append(row)
        print(f"{kind:<10} {name:<44} {us:9.1f} us  " + (f"{row['frac_copy_bw']:6.1%} of copy bw  " if nbytes else "")
              + (f"{row['TFLOP/s']:6.1f} TFLOP/s ({row['frac_matmul']:.1%} of matmul)" if flops else ""), flush=True)
        return row

    for model, batch, ctx in itertools.product(MODELS, (1, 64), (1024, 4096)):
        b = make([1] * batch, [ctx] * batch, model)
        (cfg,) = ta.default_config(*b.sets[0][:2], b.sets[0][3], b.sets[0][4])
        add("decode", f"{model} batch {batch} ctx {ctx}", b.time(), nbytes=b.kv_bytes, splits=cfg.num_splits)
        del b
    for model in MODELS:
        b = make([512], [1536], model)
        add("prefill", f"{model} 512 chunk, 1k prefix", b.time(), flops=b.flops())
        b = make([2048] * 4, [4096] * 4, model)
        add("prefill", f"{model} 4 x 2048 chunks, 2k prefix", b.time(), flops=b.flops())
        b = make([1] * 64 + [512], [1024] * 64 + [1536], model)
        add("mixed", f"{model} 64x1k dec + 512 chunk", b.time(), nbytes=b.kv_bytes, flops=b.flops())
        us = b.time(ta.AttentionConfig(64, 64, 4, 3))
        add("mixed", f"{model} same, in one launch", us, nbytes=b.kv_bytes, flops=b.flops())
        del b
    for model in MODELS:
        _, kvh, hd = MODELS[model]
        tokens = 8192
        k = torch.randn(tokens, kvh, hd, device=DEV, dtype=DT)
        v = torch.randn_like(k)
        kc = torch.empty(tokens * 4 // 16, 16, kvh, hd, device=DEV, dtype=DT)
        vc = torch.empty_like(kc)
        slots = torch.randperm(tokens * 4, device=DEV)[:tokens]
        us = bench_graph([lambda k=k, v=v, kc=kc, vc=vc, slots=slots: ta.write_kv(k, v, kc, vc, slots)])
        add("write_kv", f"{model} {tokens} tokens", us, nbytes=4 * k.numel() * DT.itemsize)
    x = torch.randn(8192, hidden, device=DEV, dtype=DT)
    res = torch.randn_like(x)
    us = bench_graph([lambda: triton_norm.rms_norm(x, w, 1e-5, res)])
    add("rms_norm", "8192 x 4096 with residual", us, nbytes=4 * x.numel() * DT.itemsize)
    qr = torch.randn(8192, heads, head_dim, device=DEV, dtype=DT)
    kr = torch.randn(8192, kv_heads, head_dim, device=DEV, dtype=DT)
    pos = torch.randint(0, 8192, (8192,), device=DEV)
    us = bench_graph([lambda: triton_rotary.rotary_embedding(qr, kr, pos, cs)])
    add("rotary", "llama3-8b 8192 tokens", us, nbytes=2 * (qr.numel() + kr.numel()) * DT.itemsize)

    dump()

    # ---- optional sweep of attention launch configs ----------------------------------------------------------
    if args.sweep:
        def try_cfgs(b, name, cfgs, nbytes=None, flops=None):
            expect = b.reference()
            for cfg in cfgs:
                try:
                    err = rel_err(b.run(cfg), expect)
                    us = b.time(cfg)
                except Exception as e:  # a config can exceed shared memory; record and go on
                    sweep.append({"case": name, "cfg": vars(cfg), "error": repr(e)[:200]})
                    print(f"sweep {name} {cfg} failed: {repr(e)[:120]}", flush=True)
                    continue
                row = {"case": name, "cfg": vars(cfg), "us": us, "rel_err": err}
                if nbytes:
                    row["frac_copy_bw"] = nbytes / (us * 1e-6) / copy_bw
                if flops:
                    row["TFLOP/s"] = flops / us / 1e6
                sweep.append(row)
                print(f"sweep {name:<28} bm {cfg.block_m:3} bn {cfg.block_n:3} w {cfg.num_warps} st {cfg.num_stages}"
                      f" sp {cfg.num_splits:2} {us:8.1f} us err {err:.1e}"
                      + (f" {row['frac_copy_bw']:.1%} bw" if nbytes else "")
                      + (f" {row['TFLOP/s']:.0f} TFLOP/s" if flops else ""), flush=True)

        for model in MODELS:
            for batch, ctx in ((64, 1024), (16, 1024), (8, 4096), (1, 1024), (1, 4096)):
                b = make([1] * batch, [ctx] * batch, model)
                splits = (1, 2, 4, 8) if batch > 1 else (4, 8, 16, 32)
                blocks_n = (64,) if batch > 1 else (32, 64)
                try_cfgs(b, f"{model} dec {batch}x{ctx}", [
                    ta.AttentionConfig(16, bn, w, st, num_splits=s) for s in splits for bn in blocks_n
                    for w, st in ((4, 3), (4, 2), (4, 1), (2, 1), (8, 1))], nbytes=b.kv_bytes)
            del b

    path = dump()
    meta = run_metadata()
    print(f"\n{card} | torch {meta['torch']} | triton {meta['triton']} | copy {copy_bw / 1e12:.2f} TB/s"
          f" | matmul {mm_flops / 1e12:.0f} TFLOP/s")
    print(f"{'kernel':<10} {'case':<44} {'us':>9} {'of copy bw':>10} {'TFLOP/s':>8}")
    for r in timings:
        print(f"{r['kernel']:<10} {r['case']:<44} {r['us']:9.1f} "
              f"{(format(r['frac_copy_bw'], '.1%') if 'frac_copy_bw' in r else ''):>10} "
              f"{(format(r['TFLOP/s'], '.1f') if 'TFLOP/s' in r else ''):>8}")
    bad = [c for c in checks if not c["rel_err"] < 1e-2 or c.get("residual_equal") is False]
    print(f"wrote {path}; checks {'FAILED: ' + str(bad) if bad else 'all passed'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
