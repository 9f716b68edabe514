"""Triton rotary embedding of q and k by position (Hugging Face ``rotate_half`` layout), one program per
token; same contract as ``reference.rotary_embedding`` (returns new tensors). ``rotary_embedding_and_write_kv``
also writes the rotated keys and the values into the paged KV cache (``reference.write_kv``) in the same launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_pdl import launch_kwargs, wait_for_previous


@triton.jit
def _rotate_heads(x_ptr, o_row, t, stride_xt, stride_xh, stride_oh, num_heads, cos, sin, j, j_ok,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    # Token t's heads of x rotated into the row at o_row (heads stride_oh apart).
    h = tl.arange(0, BLOCK_H)[:, None]
    mask = (h < num_heads) & j_ok[None, :]
    src = x_ptr + t * stride_xt + h * stride_xh + j[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = o_row + h * stride_oh + j[None, :]
    tl.store(dst, (x1 * cos - x2 * sin).to(o_row.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(o_row.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cs_ptr,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
                   stride_cs, num_heads, num_kv_heads, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_vt, stride_vh,
                   stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                   HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                   WRITE_KV: tl.constexpr, BLOCK_SIZE: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_previous(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    j_ok = j < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=j_ok, other=0.0)[None, :]
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=j_ok, other=0.0)[None, :]
    _rotate_heads(q_ptr, qo_ptr + t * stride_qot, t, stride_qt, stride_qh, stride_qoh, num_heads, cos, sin, j, j_ok,
                  HALF, BLOCK_HQ)
    if WRITE_KV:  # rotated keys and the values straight into the cache slot (-1: none)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            blk = slot // BLOCK_SIZE
            off = slot % BLOCK_SIZE
            _rotate_heads(k_ptr, kc_ptr + blk * stride_kcb + off * stride_kcs, t, stride_kt, stride_kh, stride_kch,
                          num_kv_heads, cos, sin, j, j_ok, HALF, BLOCK_HK)
            h = tl.arange(0, BLOCK_HK)[:, None]
            d = tl.arange(0, 2 * BLOCK_HALF)[None, :]
            mask = (h < num_kv_heads) & (d < 2 * HALF)
            v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
            tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + h * stride_vch + d, v.to(vc_ptr.dtype.element_ty),
                     mask=mask)
    else:
        _rotate_heads(k_ptr, ko_ptr + t * stride_kot, t, stride_kt, stride_kh, stride_koh, num_kv_heads, cos, sin, j,
                      j_ok, HALF, BLOCK_HK)


def _check(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"expected q [T, H, D] and k [T, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    head_dim = q.shape[2]
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim or head_dim % 2:
        raise ValueError(f"head_dim {head_dim} unsupported with cos_sin_cache {tuple(cos_sin_cache.shape)}: "
                         "need an even head_dim equal to the cache's width")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions {tuple(positions.shape)} must be [T] with T = {q.shape[0]}")


def _launch(q, k, positions, cos_sin_cache, k_out, kv_write, pdl):
    """q rotated into a new tensor (returned); k rotated into ``k_out``, or with ``kv_write`` = (v, k_cache,
    v_cache, slot_mapping) into the cache, v beside it."""
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(2) != 1:
        k = k.contiguous()
    cos_sin_cache = cos_sin_cache.contiguous()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if q.shape[0] == 0:
        return q_out
    if kv_write is None:
        v = kc = vc = slots = k_out  # unused
        cache_strides = (0,) * 6
        block_size = 1
    else:
        v, kc, vc, slots = kv_write
        if v.stride(2) != 1:
            v = v.contiguous()
        cache_strides = (*kc.stride()[:3], *vc.stride()[:3])
        block_size = kc.shape[1]
        k_out = k  # unused
    half = q.shape[2] // 2
    _rotary_kernel[(q.shape[0],)](
        q, k, q_out, k_out, positions, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
        q.shape[1], k.shape[1], v, kc, vc, slots, v.stride(0), v.stride(1), *cache_strides,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_HQ=triton.next_power_of_2(q.shape[1]),
        BLOCK_HK=triton.next_power_of_2(k.shape[1]), WRITE_KV=kv_write is not None, BLOCK_SIZE=block_size,
        num_warps=4, **launch_kwargs(pdl))
    return q_out


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] by ``positions`` [T]; cos_sin_cache [max_pos, D] float32 (cos|sin).
    ``pdl``: launch with PDL (``triton_pdl``)."""
    _check(q, k, positions, cos_sin_cache)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    return _launch(q, k, positions, cos_sin_cache, k_out, None, pdl), k_out


def rotary_embedding_and_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                                  cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  slot_mapping: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """Rotated q; the rotated k and v written into the paged cache at ``slot_mapping`` (-1 skips a token), as
    ``rotary_embedding`` then ``write_kv`` (``triton_attention``) would, in one launch."""
    _check(q, k, positions, cos_sin_cache)
    if v.shape != k.shape or k.shape[1:] != k_cache.shape[2:] or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected k, v [T, Hkv, D] matching caches [blocks, block_size, Hkv, D], got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    return _launch(q, k, positions, cos_sin_cache, None, (v, k_cache, v_cache, slot_mapping), pdl)
