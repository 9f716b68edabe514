"""``EngineConfig``: everything an ``LLMEngine`` is built from, with the defaults written once (torch-free, so
command-line tools and the server's API process read it without importing torch)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.policy import PolicyConfig
from engine.policy.config import option_metadata, resolve_aliases

# How the sampler draws a token where a request neither truncates (top-k, top-p) nor is greedy (``engine.sampler``):
# "vocab-order", where its uniform meets the softmax summed in vocabulary order; engines before commit 0570fa2
# sorted every row ("sort"). Served runs record it, so that calibration tells the engines' runs apart.
SAMPLER_DRAWS = ("sort", "vocab-order")
SAMPLER_DRAW = "vocab-order"


@dataclass(frozen=True)
class EngineConfig:
    """The model, its scheduling policy and how the engine runs it."""

    model: str  # a preset name (random weights, ``engine.presets``) or a local Hugging Face directory
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    num_kv_blocks: int | None = field(default=None, metadata=option_metadata("KV blocks (default: as memory allows)."))
    max_model_len: int | None = field(default=None, metadata=option_metadata("Cap on prompt + output tokens."))
    dtype: str = field(default="auto", metadata=option_metadata("auto | float32 | float16 | bfloat16."))
    device: str = field(default="auto", metadata=option_metadata("auto | cpu | cuda."))
    seed: int = field(default=0, metadata=option_metadata("Seed of random weights and of sampling."))
    gpu_memory_utilization: float = field(default=0.9, metadata=option_metadata(
        "Share of the card's memory the engine may use (weights, activations and the KV cache)."))
    enforce_eager: bool = field(default=False, metadata=option_metadata(
        "No CUDA graphs: every pass launches its kernels from Python.", "--enforce-eager"))
    pipeline_decodes: bool = field(default=True, metadata=option_metadata(
        "Enqueue the next greedy decode pass before waiting for this one's tokens."))

    @classmethod
    def from_kwargs(cls, model: str, **kwargs) -> EngineConfig:
        """A config from flat keyword arguments: any field of ``EngineConfig`` or of ``PolicyConfig``
        (``LLM("llama-2-7b", max_num_batched_tokens=512, device="cpu")``; old names such as ``token_budget`` work
        too). TypeError names an unknown one."""
        kwargs = resolve_aliases(kwargs)
        engine = {f.name for f in dataclasses.fields(cls)} - {"model"}
        policy = {f.name for f in dataclasses.fields(PolicyConfig)}
        unknown = sorted(set(kwargs) - engine - policy)
        if unknown:
            raise TypeError(f"unknown engine option(s) {', '.join(unknown)}; known: "
                            f"{', '.join(sorted(engine | policy))}")
        policy_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in policy}
        base = kwargs.pop("policy", None) or PolicyConfig()
        return cls(model, dataclasses.replace(base, **policy_kwargs), **kwargs)
