"""Shared fixtures: tiny Hugging Face checkpoints of every family, written with ``save_pretrained``."""

from __future__ import annotations

import os

import pytest

# Tests use tiny models: one thread avoids OpenMP spin-waiting on a shared 2-core machine (16x faster here).
# Set through the environment so that this file does not import torch (the policy layer is tested torch-free).
os.environ.setdefault("OMP_NUM_THREADS", "1")

_COMMON = {"vocab_size": 160, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_LLAMA = {**_COMMON, "intermediate_size": 96, "num_key_value_heads": 4, "rms_norm_eps": 1e-5}

TINY_CONFIGS = {
    "llama": ("LlamaConfig", _LLAMA),
    "llama-gqa": ("LlamaConfig", {**_LLAMA, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "llama3-rope": ("LlamaConfig", {**_LLAMA, "num_key_value_heads": 1, "rope_theta": 500000.0,
                                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 32}}),
    "mistral": ("MistralConfig", {**_LLAMA, "num_key_value_heads": 2, "sliding_window": None,
                                  "head_dim": 32}),
    "qwen2": ("Qwen2Config", {**_LLAMA, "num_key_value_heads": 2, "rope_theta": 1000000.0}),
    "opt": ("OPTConfig", {**_COMMON, "ffn_dim": 96, "word_embed_proj_dim": 64, "do_layer_norm_before": True}),
    "opt-post-ln": ("OPTConfig", {**_COMMON, "ffn_dim": 96, "word_embed_proj_dim": 32,
                                  "do_layer_norm_before": False}),
}


def randomize(model, seed: int, std: float = 0.15) -> None:
    """Seeded weights with every bias and norm perturbed too (HF zero-initializes biases, which would hide a
    bias that we forgot), scaled so logits are peaked and greedy choices are far from ties."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(std * noise)


def make_hf_model(family: str, seed: int = 0):
    """A transformers model of a tiny config of ``family`` in float32 with seeded random weights."""
    import torch
    import transformers

    config_class, kwargs = TINY_CONFIGS[family]
    config = getattr(transformers, config_class)(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    model.generation_config.eos_token_id = None  # generate the full length, as our engine does with ignore_eos
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """``hf_checkpoint(family)`` -> (directory written by save_pretrained, the transformers model)."""
    cache = {}

    def make(family: str):
        if family not in cache:
            model = make_hf_model(family)
            path = tmp_path_factory.mktemp(family)
            model.save_pretrained(path)
            cache[family] = (path, model)
        return cache[family]

    return make
