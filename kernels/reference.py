"""Plain-PyTorch references of every kernel: the CPU path of the engine and the oracle for the Triton tests.

Shapes shared by all kernels (T = tokens in the pass, B = sequences in the pass):
- KV cache of one layer: ``k_cache``/``v_cache`` of shape [num_blocks, block_size, num_kv_heads, head_dim].
- ``slot_mapping`` [T] int64: cache slot of each new token (block_id * block_size + offset); -1 skips a token.
- ``block_tables`` [B, max_blocks] int32, rows padded with any valid block id.
- ``context_lens`` [B] int32: tokens of each sequence in the cache *after* this pass's write.
- ``query_start_loc`` [B + 1] int32: cumulative query lengths; sequence b owns q[qsl[b]:qsl[b+1]].
  Query j of a sequence with q_len queries sits at position context_len - q_len + j and attends causally to
  cache positions 0..that position (prompt chunks see their cached prefix plus themselves; a decode is q_len 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter new keys/values [T, Hkv, D] into the paged cache at ``slot_mapping``."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = k[keep].to(k_cache.dtype)
    v_flat[slots] = v[keep].to(v_cache.dtype)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of a ragged mixed batch (prompt chunks and decodes) over the paged cache.

    q: [T, H, D]; returns [T, H, D] in q's dtype. Grouped-query attention when H > Hkv.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for b, ctx in enumerate(lens):
        q_b = q[starts[b]:starts[b + 1]]
        q_len = q_b.shape[0]
        if q_len == 0:
            continue
        n_blocks = (ctx + block_size - 1) // block_size
        blocks = block_tables[b, :n_blocks].long()
        k_b = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        v_b = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        k_b = k_b.repeat_interleave(group, dim=1).transpose(0, 1).float()  # [H, ctx, D]
        v_b = v_b.repeat_interleave(group, dim=1).transpose(0, 1).float()
        scores = torch.einsum("qhd,hkd->hqk", q_b.float(), k_b) * scale
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)
        scores.masked_fill_(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[b]:starts[b + 1]] = torch.einsum("hqk,hkd->qhd", probs, v_b).to(q.dtype)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with the residual add fused in front: returns (norm(x + residual) * weight, x + residual)."""
    if residual is not None:
        x = x + residual
    residual_out = x
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), residual_out  # same order of casts as Hugging Face's LlamaRMSNorm


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, Hkv, D] by position, Hugging Face ``rotate_half`` (NeoX) layout.

    cos_sin_cache: [max_positions, D] float32, cos in the first D/2 columns and sin in the last D/2.
    """
    half = cos_sin_cache.shape[1] // 2
    cs = cos_sin_cache[positions]
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] (gate then up, a merged projection) -> silu(gate) * up [..., I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu_and_mul(linear(x, weight, bias)): a merged gate/up projection [2I, K] and its activation -> [..., I]."""
    return silu_and_mul(linear(x, weight, bias))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias) -> [..., N], as ``nn.Linear``."""
    return F.linear(x, weight, bias)
