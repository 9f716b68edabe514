"""Few-row linear layers: the Triton weight-stream kernel (``kernels/triton_linear.py``) against cuBLAS.

Run on a CUDA machine from the repository root: ``python -m benchmarks.linear_gpu [--sweep] [--out DIR]``.
For the projections of Llama-2-7B and Llama-3-8B at 1-128 rows it times ``F.linear`` (cuBLAS) and the kernel's
default config, prints the weight-read bandwidth of each as a share of the device-to-device copy bandwidth
measured in the same run, and writes ``linear_gpu_<card>.json``. Times are ``do_bench`` medians of CUDA-graph
replays cycling through enough weight copies to defeat the L2 cache (``benchmarks.common.bench_graph``). ``--sweep``
first times a grid of launch configs per row count (the source of ``default_config``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os

import torch
import torch.nn.functional as F
import triton

from benchmarks.common import bench_graph, run_metadata, write_results
from kernels import triton_linear as tl_

DEV, DT = "cuda", torch.bfloat16
# (N, K) of each linear layer, and how many of it a forward pass runs
SHAPES = {
    "llama2-7b": {"qkv": (12288, 4096, 32), "o": (4096, 4096, 32), "gate_up": (22016, 4096, 32),
                  "down": (4096, 11008, 32), "lm_head": (32000, 4096, 1)},
    "llama3-8b": {"qkv": (6144, 4096, 32), "o": (4096, 4096, 32), "gate_up": (28672, 4096, 32),
                  "down": (4096, 14336, 32), "lm_head": (128256, 4096, 1)},
}
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
L2_SAFE_BYTES = 256 << 20


class Case:
    """Weight copies of one shape (enough to overflow the L2) and an input of ``m`` rows for each."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        copies = max(1, min(8, math.ceil(L2_SAFE_BYTES / (n * k * DT.itemsize))))
        self.weights = [torch.randn(n, k, device=DEV, dtype=DT) / k ** 0.5 for _ in range(copies)]

    def time(self, m: int, fn) -> float:
        xs = [torch.randn(m, self.k, device=DEV, dtype=DT) for _ in self.weights]
        return bench_graph([lambda x=x, w=w: fn(x, w) for x, w in zip(xs, self.weights)])

    def error(self, m: int, cfg) -> float:
        x = torch.randn(m, self.k, device=DEV, dtype=DT)
        out = tl_.linear_with(x, self.weights[0], None, cfg).double()
        expect = F.linear(x.float(), self.weights[0].float()).double()
        return ((out - expect).norm() / expect.norm()).item()


def sweep_configs(m: int) -> list[tl_.LinearConfig]:
    if m == 1:
        return [tl_.LinearConfig(1, bn, bk, w, st) for bn, bk, w, st in itertools.product(
            (8, 16, 32), (256, 512, 1024), (4, 8), (1, 3)) if bn * bk <= 16384]
    bm = max(16, triton.next_power_of_2(m))
    return [tl_.LinearConfig(bm, bn, bk, 4, st) for bn, bk, st in itertools.product(
        (16, 32, 64), (128, 256), (3, 4, 5)) if bm * bk + bn * bk <= 64 * 256 * 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time a grid of launch configs first")
    ap.add_argument("--out", default=os.environ.get("OUT"),
                    help="an existing folder, or the file to write (default: $OUT, else benchmarks/results/)")
    args = ap.parse_args()
    from calibration.sweep import device_ceilings

    props = torch.cuda.get_device_properties(0)
    copy_bw = device_ceilings(torch.device(DEV))["copy_bandwidth_Bps"]
    print(f"{props.name}: copy {copy_bw / 1e12:.2f} TB/s", flush=True)
    result = {"copy_bw_Bps": copy_bw, "max_rows": tl_.MAX_ROWS, "sweep": [], "rows": []}
    cases = {(n, k): None for shapes in SHAPES.values() for n, k, _ in shapes.values()}
    for key in cases:
        cases[key] = Case(*key)

    def frac(n, k, us):
        return n * k * DT.itemsize / (us * 1e-6) / copy_bw

    if args.sweep:
        for m in (1, 4, 16, 64):
            for (n, k), case in cases.items():
                for cfg in sweep_configs(m):
                    try:
                        err = case.error(m, cfg)
                        us = case.time(m, lambda x, w, cfg=cfg: tl_.linear_with(x, w, None, cfg))
                    except Exception as e:  # a config can exceed shared memory or registers
                        result["sweep"].append({"m": m, "n": n, "k": k, "cfg": vars(cfg), "error": repr(e)[:160]})
                        continue
                    result["sweep"].append({"m": m, "n": n, "k": k, "cfg": vars(cfg), "us": us, "rel_err": err,
                                            "frac_copy_bw": frac(n, k, us)})
                best = min((r for r in result["sweep"] if r["m"] == m and (r["n"], r["k"]) == (n, k) and "us" in r),
                           key=lambda r: r["us"])
                print(f"sweep m {m:3} {n:6}x{k:5}: best {best['cfg']} {best['us']:.1f} us "
                      f"{best['frac_copy_bw']:.1%}", flush=True)
            write_results(args.out, "linear_gpu", result)

    for m in ROWS:
        for (n, k), case in cases.items():
            cublas = case.time(m, lambda x, w: F.linear(x, w))
            cfg = tl_.default_config(m, n, k)
            triton_us = case.time(m, lambda x, w, cfg=cfg: tl_.linear_with(x, w, None, cfg))
            row = {"m": m, "n": n, "k": k, "cublas_us": cublas, "triton_us": triton_us, "cfg": vars(cfg),
                   "rel_err": case.error(m, cfg), "cublas_frac_copy_bw": frac(n, k, cublas),
                   "triton_frac_copy_bw": frac(n, k, triton_us)}
            result["rows"].append(row)
            print(f"m {m:3} {n:6}x{k:5}  cuBLAS {cublas:7.1f} us {row['cublas_frac_copy_bw']:6.1%}  "
                  f"triton {triton_us:7.1f} us {row['triton_frac_copy_bw']:6.1%}  err {row['rel_err']:.1e}",
                  flush=True)
        write_results(args.out, "linear_gpu", result)

    meta = run_metadata()
    print(f"\n{props.name} | torch {meta['torch']} | triton {meta['triton']} | copy {copy_bw / 1e12:.2f} TB/s")
    print(f"{'model':<10} {'rows':>4} {'cuBLAS ms/pass':>15} {'triton ms/pass':>15} {'ratio':>6}")
    for model, shapes in SHAPES.items():
        for m in ROWS:
            by = {(r["n"], r["k"]): r for r in result["rows"] if r["m"] == m}
            cub = sum(by[(n, k)]["cublas_us"] * c for n, k, c in shapes.values()) / 1e3
            tri = sum(by[(n, k)]["triton_us"] * c for n, k, c in shapes.values()) / 1e3
            result.setdefault("per_pass", []).append({"model": model, "m": m, "cublas_ms": cub, "triton_ms": tri})
            print(f"{model:<10} {m:>4} {cub:15.3f} {tri:15.3f} {cub / tri:6.2f}")
    print(f"wrote {write_results(args.out, 'linear_gpu', result)}")


if __name__ == "__main__":
    main()
