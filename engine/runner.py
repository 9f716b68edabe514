"""ModelRunner: owns the model and its paged KV cache, turns a ``BatchPlan`` into ONE forward pass, samples.

All tensor building happens in ``prepare_inputs`` (host work, vectorized), so CUDA graphs can later capture
``execute_model`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.layers import AttentionMetadata, KVCache
from engine.sampler import Sampler
from engine.scheduler import BatchPlan

CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on the CPU: 1 GiB (pass num_kv_blocks to choose exactly)


@dataclass
class ModelInputs:
    """A plan flattened into the tensors of one forward pass."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] int64: the last row of each entry that samples, in plan order


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block across all layers (keys and values)."""
    item = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * item


def cuda_kv_cache_bytes(device: torch.device, gpu_memory_utilization: float) -> int:
    """KV budget on a GPU: ``gpu_memory_utilization`` of the card minus what is already in use (weights).

    TODO(gpu): reserve the activation peak of a profiling pass at the full token budget before this is final.
    """
    free, total = torch.cuda.mem_get_info(device)
    return max(0, int(total * gpu_memory_utilization) - (total - free))


def default_num_kv_blocks(config: ModelConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                          max_num_seqs: int, max_model_len: int, gpu_memory_utilization: float = 0.9) -> int:
    """As many blocks as the memory budget holds, but no more than ``max_num_seqs`` full-length sequences need."""
    if device.type == "cuda":
        budget = cuda_kv_cache_bytes(device, gpu_memory_utilization)
    else:
        budget = CPU_KV_CACHE_BYTES
    blocks = budget // kv_block_bytes(config, block_size, dtype)
    needed = max_num_seqs * -(-max_model_len // block_size)
    num_blocks = min(blocks, needed)
    if num_blocks < 1:
        raise ValueError(f"no memory left for even one KV block of {block_size} tokens on {device}")
    return num_blocks


class ModelRunner:
    def __init__(self, model: nn.Module, config: ModelConfig, num_kv_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
        self.model = model
        self.config = config
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.device = torch.device(device)
        self.dtype = dtype
        self.sampler = Sampler(seed)
        shape = (config.num_layers, 2, num_kv_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        self.kv_caches: list[KVCache] = [(layer[0], layer[1]) for layer in self.kv_cache]

    def prepare_inputs(self, plan: BatchPlan) -> ModelInputs:
        """Flatten the plan: entry i feeds positions start_i .. start_i + n_i - 1 of its request."""
        token_ids: list[int] = []
        tables: list[list[int]] = []
        for request, start, n in zip(plan.requests, plan.start_positions, plan.num_new_tokens):
            token_ids += request.token_ids(start, start + n)
            tables.append(request.block_table)
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        num_new = torch.tensor(plan.num_new_tokens, dtype=torch.int64)
        starts = torch.tensor(plan.start_positions, dtype=torch.int64)
        query_start_loc = torch.zeros(len(tables) + 1, dtype=torch.int64)
        torch.cumsum(num_new, 0, out=query_start_loc[1:])
        seq_of_token = torch.repeat_interleave(torch.arange(len(tables)), num_new)
        positions = torch.arange(len(token_ids)) - query_start_loc[seq_of_token] + starts[seq_of_token]
        bs = self.block_size
        slot_mapping = block_tables[seq_of_token, positions // bs].long() * bs + positions % bs
        sample_rows = query_start_loc[1:][torch.tensor(plan.samples, dtype=torch.bool)] - 1
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            block_tables=block_tables.to(dev),
            context_lens=(starts + num_new).to(torch.int32).to(dev),
            query_start_loc=query_start_loc.to(torch.int32).to(dev),
        )
        return ModelInputs(torch.tensor(token_ids, dtype=torch.int64, device=dev), positions.to(dev), meta,
                           sample_rows.to(dev))

    @torch.inference_mode()
    def execute_model(self, inputs: ModelInputs) -> torch.Tensor:
        """The forward pass; returns logits [S, vocab] for the sampling rows only."""
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        return self.model.compute_logits(hidden[inputs.sample_rows])

    @torch.inference_mode()
    def run(self, plan: BatchPlan) -> list[int]:
        """One pass for the plan; returns one sampled token id per entry with ``samples`` set, in plan order."""
        logits = self.execute_model(self.prepare_inputs(plan))
        sampling = [r for r, s in zip(plan.requests, plan.samples) if s]
        if not sampling:
            return []
        return self.sampler(logits, sampling)
