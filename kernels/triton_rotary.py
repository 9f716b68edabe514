"""Triton rotary embedding of q and k by position (Hugging Face ``rotate_half`` layout), one program per
token; same contract as ``reference.rotary_embedding`` (returns new tensors)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, o_ptr, t, stride_xt, stride_xh, stride_ot, stride_oh, num_heads, cos, sin, j, j_ok,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    mask = (h < num_heads) & j_ok[None, :]
    src = x_ptr + t * stride_xt + h * stride_xh + j[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = o_ptr + t * stride_ot + h * stride_oh + j[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cs_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
                   stride_cs, num_heads, num_kv_heads, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                   BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    j_ok = j < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=j_ok, other=0.0)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=j_ok, other=0.0)[None, :]
    _rotate_heads(q_ptr, qo_ptr, t, stride_qt, stride_qh, stride_qot, stride_qoh, num_heads, cos, sin, j, j_ok,
                  HALF, BLOCK_HQ)
    _rotate_heads(k_ptr, ko_ptr, t, stride_kt, stride_kh, stride_kot, stride_koh, num_kv_heads, cos, sin, j,
                  j_ok, HALF, BLOCK_HK)


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] by ``positions`` [T]; cos_sin_cache [max_pos, D] float32 (cos|sin)."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"expected q [T, H, D] and k [T, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    head_dim = q.shape[2]
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim or head_dim % 2:
        raise ValueError(f"head_dim {head_dim} unsupported with cos_sin_cache {tuple(cos_sin_cache.shape)}: "
                         "need an even head_dim equal to the cache's width")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions {tuple(positions.shape)} must be [T] with T = {q.shape[0]}")
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(2) != 1:
        k = k.contiguous()
    cos_sin_cache = cos_sin_cache.contiguous()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    if q.shape[0] == 0:
        return q_out, k_out
    half = head_dim // 2
    _rotary_kernel[(q.shape[0],)](
        q, k, q_out, k_out, positions, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
        q.shape[1], k.shape[1], HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(q.shape[1]), BLOCK_HK=triton.next_power_of_2(k.shape[1]), num_warps=4)
    return q_out, k_out
