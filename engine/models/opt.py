"""OPT over the paged KV cache: learned positions (offset 2), LayerNorm before or after, ReLU FFN.

Module names mirror Hugging Face's ``OPTForCausalLM`` so checkpoints load by name.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import AttentionMetadata, KVCache, Linear, PagedAttention, activation

POSITION_OFFSET = 2  # OPT's position table has two extra leading rows (a fairseq padding legacy)


class OPTAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, c.hidden_size, bias=c.enable_bias)
        self.k_proj = Linear(c.hidden_size, c.hidden_size, bias=c.enable_bias)
        self.v_proj = Linear(c.hidden_size, c.hidden_size, bias=c.enable_bias)
        self.out_proj = Linear(c.hidden_size, c.hidden_size, bias=c.enable_bias)
        self.attn = PagedAttention(c.num_heads, c.num_heads, c.head_dim, c.head_dim ** -0.5)

    def forward(self, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        shape = (-1, self.num_heads, self.head_dim)
        q, k, v = self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)
        out = self.attn(q, k, v, kv_cache, meta)
        return self.out_proj(out.reshape(x.shape[0], -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.pre_norm = c.do_layer_norm_before
        self.self_attn = OPTAttention(c)
        self.self_attn_layer_norm = nn.LayerNorm(c.hidden_size, elementwise_affine=c.layer_norm_elementwise_affine)
        self.fc1 = Linear(c.hidden_size, c.intermediate_size, bias=c.enable_bias)
        self.fc2 = Linear(c.intermediate_size, c.hidden_size, bias=c.enable_bias)
        self.final_layer_norm = nn.LayerNorm(c.hidden_size, elementwise_affine=c.layer_norm_elementwise_affine)
        self.act = activation(c.hidden_act)

    def forward(self, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        h = self.self_attn_layer_norm(x) if self.pre_norm else x
        x = x + self.self_attn(h, kv_cache, meta)
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        h = self.final_layer_norm(x) if self.pre_norm else x
        x = x + self.fc2(self.act(self.fc1(h)))
        return x if self.pre_norm else self.final_layer_norm(x)


class OPTDecoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        proj_dim = c.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(c.vocab_size, proj_dim)
        self.embed_positions = nn.Embedding(c.max_position_embeddings + POSITION_OFFSET, c.hidden_size)
        self.project_in = Linear(proj_dim, c.hidden_size, bias=False) if proj_dim != c.hidden_size else None
        self.project_out = Linear(c.hidden_size, proj_dim, bias=False) if proj_dim != c.hidden_size else None
        has_final_norm = c.do_layer_norm_before and not c.remove_final_layer_norm
        self.final_layer_norm = (nn.LayerNorm(c.hidden_size, elementwise_affine=c.layer_norm_elementwise_affine)
                                 if has_final_norm else None)
        self.layers = nn.ModuleList(OPTDecoderLayer(c) for _ in range(c.num_layers))

    def forward(self, input_ids, positions, kv_caches, meta):
        x = self.embed_tokens(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + self.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, kv_cache, meta)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x


class OPTModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the LM head with the input embedding when the config says so (again after ``to_empty``)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.decoder.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        """Flattened ragged batch: ids/positions [T] -> hidden states [T, word_embed_proj_dim]."""
        return self.model.decoder(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] of the rows given (the caller selects the sampling rows first)."""
        return self.lm_head(hidden)
