"""Triton fused SiLU-and-multiply of a merged gate/up projection: same contract as ``reference.silu_and_mul``.

Unfused, ``silu(gate) * up`` reads and writes the [T, I] intermediate three times; this reads [T, 2I] once and
writes [T, I] once, in one launch instead of two (which also matters inside decode CUDA graphs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_pdl import launch_kwargs, wait_for_previous


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_previous(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    # Round silu(gate) to the input dtype before the product, as the reference's two eager ops do.
    act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """x [..., 2I] (gate then up) -> silu(gate) * up [..., I]; ``pdl``: launch with PDL (``triton_pdl``)."""
    if x.shape[-1] % 2:
        raise ValueError(f"last dimension {x.shape[-1]} must be even (gate and up halves)")
    n = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    rows = x2.shape[0]
    if rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(n))
    _silu_and_mul_kernel[(rows, triton.cdiv(n, block))](x2, out.view(-1, n), x2.stride(0), n, n, BLOCK=block,
                                                       num_warps=4, **launch_kwargs(pdl))
    return out
