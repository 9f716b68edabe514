"""Triton linear layer for few rows (decode batches): y = x @ W^T + b, same contract as ``reference.linear``.

With few rows a linear layer is a stream over its weight matrix, and its speed is the bandwidth of that stream.
Each program owns BLOCK_N output columns and walks the whole of K, so a weight element is read exactly once,
with no split-K reduction kernel after it. One row (BLOCK_M == 1) accumulates ``w * x`` element-wise in fp32
registers and reduces once at the end; more rows use ``tl.dot`` on a [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N]
tile, whose operand loads Triton pipelines through shared memory.

``linear_silu_and_mul`` runs a merged gate/up projection with the activation in its epilogue: each program takes
matching gate and up columns (two accumulators) and writes silu(gate) * up, so no activation kernel follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton_pdl import launch_kwargs, launch_next, wait_for_previous, wait_only


@triton.jit
def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN: tl.constexpr, PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, GATED: tl.constexpr,
                   USE_PDL: tl.constexpr):
    # GATED: W is [2N, K] (gate rows, then up rows) and y [M, N] = silu(x W_gate^T) * (x W_up^T); a program takes
    # BLOCK_N gate rows and the BLOCK_N matching up rows (``u``), in a second accumulator of the same layout. Its
    # next kernel is the down projection, as large: with PDL it may launch only once this one's loops are done.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    u_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    if BLOCK_M == 1:
        # The first weight tile is loaded before waiting for the kernel that writes x (with PDL, while it drains).
        w_mask = n_ok[:, None] & (offs_k < K)[None, :]
        w = tl.load(w_ptrs) if EVEN else tl.load(w_ptrs, mask=w_mask, other=0.0)
        if GATED:
            u = tl.load(u_ptrs) if EVEN else tl.load(u_ptrs, mask=w_mask, other=0.0)
            wait_only(USE_PDL)
        else:
            wait_for_previous(USE_PDL)
        x = tl.load(x_ptrs) if EVEN else tl.load(x_ptrs, mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        x = x.to(tl.float32)
        acc2 = w.to(tl.float32) * x
        if GATED:
            up2 = u.to(tl.float32) * x
        for k in tl.range(BLOCK_K, K, BLOCK_K, num_stages=NUM_STAGES):
            k_ok = (offs_k + k) < K
            w = tl.load(w_ptrs + k) if EVEN else tl.load(w_ptrs + k, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptrs + k) if EVEN else tl.load(x_ptrs + k, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            x = x.to(tl.float32)
            acc2 += w.to(tl.float32) * x
            if GATED:
                u = tl.load(u_ptrs + k) if EVEN else tl.load(u_ptrs + k, mask=n_ok[:, None] & k_ok[None, :],
                                                             other=0.0)
                up2 += u.to(tl.float32) * x
        acc = tl.sum(acc2, 1)[None, :]
        if GATED:
            up = tl.sum(up2, 1)[None, :]
    else:
        if GATED:
            wait_only(USE_PDL)
        else:
            wait_for_previous(USE_PDL)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if GATED:
            up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            k_ok = (offs_k + k) < K
            w = tl.load(w_ptrs + k) if EVEN else tl.load(w_ptrs + k, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptrs + k, mask=m_ok[:, None] & (k_ok[None, :] | EVEN), other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            if GATED:
                u = tl.load(u_ptrs + k) if EVEN else tl.load(u_ptrs + k, mask=n_ok[:, None] & k_ok[None, :],
                                                             other=0.0)
                up = tl.dot(x, tl.trans(u), up, input_precision=PRECISION)
    if GATED:
        launch_next(USE_PDL)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            up += tl.load(b_ptr + N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc * tl.sigmoid(acc) * up
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Rows up to which ``linear`` uses this kernel on CUDA, cuBLAS beyond, where cuBLAS wins (benchmarks/linear_gpu.py;
# benchmarks/RESULTS.md, design decisions). 0 turns the kernel off.
MAX_ROWS = 16


def default_config(m: int, n: int, k: int) -> LinearConfig:
    """Launch shape for an [m, k] x [k, n] product: the best of a sweep over Llama-2-7B and Llama-3-8B shapes
    (``benchmarks/linear_gpu.py --sweep``), close to each shape's own best."""
    if m == 1:
        return LinearConfig(1, 8, 1024 if k % 1024 == 0 else 512, 4, 3)
    return LinearConfig(16, 32, 256, 4, 5)


def gated_config(m: int) -> LinearConfig:
    """Launch shape of ``linear_silu_and_mul`` (``block_n`` output columns: twice as many weight rows), the best of
    a sweep on Llama-2-7B's gate/up projection (``benchmarks/linear_gpu.py``; it beats the product followed by
    ``silu_and_mul``)."""
    return LinearConfig(1, 2, 1024, 4, 2) if m == 1 else LinearConfig(16, 32, 128, 4, 3)


def linear_with(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: LinearConfig,
                pdl: bool = False, gated: bool = False) -> torch.Tensor:
    """``linear`` with an explicit launch config (tests and tuning); ``pdl``: launch with PDL (``triton_pdl``).
    ``gated``: ``linear_silu_and_mul`` instead (the weight holds the gate rows, then the up rows)."""
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"expected x [..., K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise ValueError(f"dtypes differ: x {x.dtype}, weight {weight.dtype}, bias {getattr(bias, 'dtype', None)}")
    if cfg.block_m != 1 and cfg.block_m < 16:
        raise ValueError(f"block_m {cfg.block_m}: 1, or at least 16 for tl.dot")
    n, k = weight.shape
    if gated:
        if n % 2:
            raise ValueError(f"gated: need an even number of weight rows (gate, then up), got {n}")
        n //= 2
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y.reshape(*x.shape[:-1], n)
    even = n % cfg.block_n == 0 and k % cfg.block_k == 0
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _linear_kernel[grid](x2, weight, bias if bias is not None else weight, y, m, n, k, x2.stride(0),
                         weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
                         BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN=even,
                         PRECISION="ieee" if x.dtype == torch.float32 else "tf32", NUM_STAGES=cfg.num_stages,
                         GATED=gated, num_warps=cfg.num_warps, **launch_kwargs(pdl))
    return y.reshape(*x.shape[:-1], n)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ bias) -> [..., N]: this kernel for up to ``MAX_ROWS`` rows of bf16/fp16,
    else cuBLAS."""
    rows = x.numel() // max(1, x.shape[-1])
    if rows > MAX_ROWS or x.dtype == torch.float32:
        return torch.nn.functional.linear(x, weight, bias)
    return linear_with(x, weight, bias, default_config(rows, *weight.shape), pdl)


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        pdl: bool = False) -> torch.Tensor:
    """silu_and_mul(linear(x, weight, bias)) (see ``kernels.reference``): in one kernel for up to ``MAX_ROWS`` rows of
    bf16/fp16, else cuBLAS and the activation kernel."""
    rows = x.numel() // max(1, x.shape[-1])
    if rows > MAX_ROWS or x.dtype == torch.float32:
        from kernels.triton_activation import silu_and_mul
        return silu_and_mul(torch.nn.functional.linear(x, weight, bias), pdl=pdl)
    return linear_with(x, weight, bias, gated_config(rows), pdl, gated=True)
