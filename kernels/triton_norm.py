"""Triton fused residual add + RMSNorm: same contract as ``reference.rms_norm``, one program per row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_pdl import launch_kwargs, wait_for_previous


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, rout_ptr, stride_x, stride_r, stride_o, stride_ro,
                     n_cols, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_previous(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # Round the sum to x's dtype before normalising, as the reference's eager add does.
        x = (x.to(tl.float32) + tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(x_ptr.dtype.element_ty)
        tl.store(rout_ptr + row * stride_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    normed = (xf * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with the residual add fused in front: returns (norm(x + residual) * weight, x + residual).
    ``pdl``: launch with PDL (``triton_pdl``)."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match hidden size {hidden}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    block = triton.next_power_of_2(hidden)
    if block > 65536:
        raise ValueError(f"hidden size {hidden} unsupported: at most 65536")
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(x.shape, device=x.device, dtype=torch.promote_types(weight.dtype, x.dtype))
    if residual is None:
        r2 = rout = x2  # unused by the kernel
        residual_out = x
    else:
        r2 = residual.reshape(-1, hidden).contiguous()
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        rout = residual_out.view(-1, hidden)
    if rows == 0:
        return out, residual_out
    out2 = out.view(-1, hidden)
    _rms_norm_kernel[(rows,)](x2, r2, weight, out2, rout, x2.stride(0), r2.stride(0), out2.stride(0),
                              rout.stride(0), hidden, eps, HAS_RESIDUAL=residual is not None, BLOCK=block,
                              num_warps=min(16, max(1, block // 256)), **launch_kwargs(pdl))
    return out, residual_out
