"""How many KV blocks fit: on a GPU, ``gpu_memory_utilization`` of the card minus what is in use after the weights
load minus the activation peaks of a profiling pass at the full token budget and of one at the largest pass graph
(CUDA graphs keep their own memory pool); on the CPU, a fixed budget."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import AttentionMetadata

logger = logging.getLogger("splitfuse.engine")

CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on the CPU: 1 GiB (pass num_kv_blocks to choose exactly)
GiB = float(1 << 30)


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block across all layers (keys and values)."""
    item = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * item


@torch.inference_mode()
def profile_activation_bytes(model: nn.Module, config: ModelConfig, num_tokens: int, num_sample_rows: int,
                             block_size: int, dtype: torch.dtype, device: torch.device) -> int:
    """Peak bytes one forward pass of ``num_tokens`` prompt tokens (plus logits and sampling of
    ``num_sample_rows`` rows) allocates beyond what is already allocated; its tiny scratch KV cache excluded."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    n_blocks = -(-num_tokens // block_size)
    shape = (n_blocks, block_size, config.num_kv_heads, config.head_dim)
    scratch = (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
    scratch_bytes = torch.cuda.memory_allocated(device) - base
    positions = torch.arange(num_tokens, device=device)
    meta = AttentionMetadata(
        slot_mapping=positions, block_tables=torch.arange(n_blocks, dtype=torch.int32, device=device)[None],
        context_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device))
    ids = torch.randint(0, config.vocab_size, (num_tokens,), device=device)
    hidden = model(ids, positions, [scratch] * config.num_layers, meta)  # every layer writes the same scratch
    logits = model.compute_logits(hidden[-min(num_sample_rows, num_tokens):])
    logits.float().softmax(-1).argmax(-1)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base - scratch_bytes
    del scratch, hidden, logits
    torch.cuda.empty_cache()
    return max(0, peak)


def num_kv_blocks_for(config: ModelConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                      max_num_seqs: int, max_model_len: int, gpu_memory_utilization: float = 0.9,
                      model: nn.Module | None = None, token_budget: int = 2048, graph_tokens: int = 0) -> int:
    """As many blocks as the memory budget holds, but no more than ``max_num_seqs`` full-length sequences need.
    On CUDA, ``model`` (already on the device) is run at ``token_budget`` tokens, and at ``graph_tokens`` (the
    largest pass graph, whose activations live in the graphs' own pool) if given, to measure activations."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    block_bytes = kv_block_bytes(config, block_size, dtype)
    needed = max_num_seqs * -(-max_model_len // block_size)
    if device.type == "cuda":
        activation = 0
        if model is not None:
            tokens = min(token_budget, max_model_len)
            activation = profile_activation_bytes(model, config, tokens, min(max_num_seqs, tokens), block_size,
                                                  dtype, device)
            if graph_tokens > 1:
                activation += profile_activation_bytes(model, config, graph_tokens,
                                                       min(max_num_seqs, graph_tokens - 1), block_size, dtype, device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        in_use = total - free  # weights, CUDA context, library workspaces, other processes
        budget = int(total * gpu_memory_utilization) - in_use - activation
        num_blocks = min(max(0, budget) // block_bytes, needed)
        logger.info("KV cache: %d blocks of %d tokens = %d tokens, %.2f GiB (card %.1f GiB x %.2f utilization; "
                    "in use after loading %.2f GiB; activation peaks at %d tokens + %d in graphs %.2f GiB)",
                    num_blocks, block_size, num_blocks * block_size, num_blocks * block_bytes / GiB, total / GiB,
                    gpu_memory_utilization, in_use / GiB, min(token_budget, max_model_len), graph_tokens,
                    activation / GiB)
    else:
        num_blocks = min(CPU_KV_CACHE_BYTES // block_bytes, needed)
        logger.info("KV cache: %d blocks of %d tokens = %d tokens, %.2f GiB on the CPU", num_blocks, block_size,
                    num_blocks * block_size, num_blocks * block_bytes / GiB)
    if num_blocks < 1:
        raise ValueError(f"no memory left for even one KV block of {block_size} tokens on {device} "
                         f"(gpu_memory_utilization {gpu_memory_utilization})")
    return num_blocks
