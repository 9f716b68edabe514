"""Building blocks shared by the model families: attention metadata, paged attention, rotary tables.

Every kernel call goes through ``ops``, the dispatcher in ``kernels``: Triton on CUDA tensors, the PyTorch
reference elsewhere (the CPU path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import kernels as ops

ACTIVATIONS = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}


@dataclass
class AttentionMetadata:
    """Where a ragged batch of tokens sits in the paged KV cache (shapes in ``kernels/reference.py``)."""

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int32
    context_lens: torch.Tensor  # [B] int32, after this pass's write
    query_start_loc: torch.Tensor  # [B + 1] int32


KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache), each [num_blocks, block_size, Hkv, D]


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def gate_up_and_act(x: torch.Tensor, gate_up: nn.Linear, name: str) -> torch.Tensor:
    """act(x W_gate^T) * (x W_up^T) through a merged gate/up projection [2I, K]; for silu, the fused kernels
    (``kernels.linear_silu_and_mul``)."""
    if name == "silu":
        return ops.linear_silu_and_mul(x, gate_up.weight, gate_up.bias)
    gate, up = gate_up(x).chunk(2, dim=-1)
    return activation(name)(gate) * up


class Linear(nn.Linear):
    """``nn.Linear`` through the kernel dispatcher (few-row products use ``kernels.triton_linear`` on CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


@torch.no_grad()
def merge_linears(*linears: nn.Linear) -> Linear:
    """One Linear whose output is the outputs of ``linears`` concatenated (one GEMM instead of several)."""
    first = linears[0]
    bias = first.bias is not None
    merged = Linear(first.in_features, sum(m.out_features for m in linears), bias=bias,
                    device=first.weight.device, dtype=first.weight.dtype)
    merged.weight.copy_(torch.cat([m.weight for m in linears]))
    if bias:
        merged.bias.copy_(torch.cat([m.bias for m in linears]))
    return merged.requires_grad_(False)


class PagedAttention(nn.Module):
    """Write this pass's keys/values into the cache, then attend over the cached context."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        ops.write_kv(k, v, *kv_cache, meta.slot_mapping)
        return self.attend(q, kv_cache, meta)

    def attend(self, q: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """Attention over the cache, this pass's keys and values already written."""
        return ops.paged_attention(q, *kv_cache, meta.block_tables, meta.context_lens, meta.query_start_loc,
                                   self.scale)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies exactly as Hugging Face computes them for default, linear and Llama-3 rope."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: keep high frequencies, divide low ones by factor, interpolate smoothly in between
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin_cache(head_dim: int, max_positions: int, theta: float, scaling: dict | None,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half of the columns, sin in the second."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
    positions = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = torch.outer(positions, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RMSNorm(nn.Module):
    """RMSNorm that also adds the residual stream in front: returns (normed, new residual)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding(nn.Module):
    """Holds the cos/sin table; ``reset_buffers`` rebuilds it after the model is materialized from ``meta``."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None):
        super().__init__()
        self.head_dim, self.max_positions, self.theta, self.scaling = head_dim, max_positions, theta, scaling
        self.register_buffer("cos_sin_cache", torch.empty(max_positions, head_dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        device = self.cos_sin_cache.device
        if device.type != "meta":
            self.cos_sin_cache = rope_cos_sin_cache(self.head_dim, self.max_positions, self.theta, self.scaling,
                                                    device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return ops.rotary_embedding(q, k, positions, self.cos_sin_cache)

    def rotate_and_cache(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                         kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """Rotated q; the rotated k and v written into the cache (one kernel on CUDA)."""
        return ops.rotary_embedding_and_write_kv(q, k, v, positions, self.cos_sin_cache, *kv_cache,
                                                 meta.slot_mapping)
