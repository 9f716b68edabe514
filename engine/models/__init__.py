"""Model families over the paged KV cache, chosen by ``config.json``'s ``model_type``.

Every model takes a flattened ragged batch (token ids [T], positions [T], per-layer KV caches, an
``AttentionMetadata``) and returns hidden states [T, hidden]; ``compute_logits`` runs the LM head on the rows
the caller selected (only the sequences that sample in this pass).
"""

from __future__ import annotations

from engine.models.config import SUPPORTED_MODEL_TYPES


def model_class(model_type: str):
    """The ``nn.Module`` class for a Hugging Face ``model_type``."""
    if model_type in ("llama", "mistral", "qwen2"):
        from engine.models.llama import LlamaForCausalLM
        return LlamaForCausalLM
    if model_type == "opt":
        from engine.models.opt import OPTForCausalLM
        return OPTForCausalLM
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
