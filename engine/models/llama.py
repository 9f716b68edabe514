"""Llama 1/2/3, Mistral and Qwen2 (qkv bias) over the paged KV cache.

A sliding window shorter than the context is served exactly by capping max_model_len at the window
(``ModelConfig.max_model_len``): below the window, windowed and full attention agree.

Module names mirror Hugging Face's ``LlamaForCausalLM`` so checkpoints load by name without renaming.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import (
    AttentionMetadata,
    KVCache,
    Linear,
    PagedAttention,
    RMSNorm,
    RotaryEmbedding,
    activation,
    gate_up_and_act,
    merge_linears,
)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.rotary = RotaryEmbedding(c.head_dim, c.max_model_len, c.rope_theta, c.rope_scaling)
        self.attn = PagedAttention(c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim ** -0.5)
        self.qkv_proj: Linear | None = None

    def merge_projections(self) -> None:
        """Replace q/k/v_proj by one ``qkv_proj`` (after loading: checkpoints keep the three names)."""
        self.qkv_proj = merge_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        if self.qkv_proj is not None:
            q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q = self.rotary.rotate_and_cache(q, k, v, positions, kv_cache, meta)
        out = self.attn.attend(q, kv_cache, meta)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act_name = c.hidden_act
        self.act = activation(c.hidden_act)
        self.gate_up_proj: Linear | None = None

    def merge_projections(self) -> None:
        """Replace gate/up_proj by one ``gate_up_proj`` feeding a fused act-and-multiply."""
        self.gate_up_proj = merge_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            return self.down_proj(gate_up_and_act(x, self.gate_up_proj, self.act_name))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, x, residual, kv_cache, meta):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids, positions, kv_caches, meta):
        x, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(positions, x, residual, kv_cache, meta)
        return self.norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the LM head with the input embedding when the config says so (again after ``to_empty``)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def merge_projections(self) -> None:
        """Merge each layer's q/k/v and gate/up projections into single GEMMs (the runner does this after
        loading the weights; fewer, larger GEMMs and launches)."""
        for layer in self.model.layers:
            layer.self_attn.merge_projections()
            layer.mlp.merge_projections()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """Flattened ragged batch: ids/positions [T] -> hidden states [T, hidden]."""
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] of the rows given (the caller selects the sampling rows first)."""
        return self.lm_head(hidden)
