"""Named model shapes (the real ones, as in each model's ``config.json``) for random-weight runs and profiling,
and the resolution of ``--model`` (preset name or local checkpoint directory)."""

from __future__ import annotations

from pathlib import Path

BUNDLED_TINY_MODEL = Path(__file__).parent / "assets" / "tiny-llama"

_LLAMA2 = {"model_type": "llama", "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
           "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu"}

PRESETS: dict[str, dict] = {
    "llama-2-7b": {**_LLAMA2, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32},
    "llama-2-13b": {**_LLAMA2, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
                    "num_attention_heads": 40, "num_key_value_heads": 40},
    "llama-2-70b": {**_LLAMA2, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8},
    "llama-3-8b": {**_LLAMA3, "max_position_embeddings": 8192},
    "llama-3.1-8b": {**_LLAMA3, "max_position_embeddings": 131072,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    # Mistral-7B-v0.3: no sliding window, so the whole 32k context is exact
    "mistral-7b": {"model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                   "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"},
    "qwen2-7b": {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                 "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                 "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643,
                 "hidden_act": "silu"},
    "opt-13b": {"model_type": "opt", "vocab_size": 50272, "hidden_size": 5120, "ffn_dim": 20480,
                "num_hidden_layers": 40, "num_attention_heads": 40, "max_position_embeddings": 2048,
                "word_embed_proj_dim": 5120, "do_layer_norm_before": True, "activation_function": "relu",
                "enable_bias": True, "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 2},
    # for tests and demos: two layers, grouped-query attention, a byte-level vocabulary
    "tiny-llama": {"model_type": "llama", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                   "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"},
}

PRESET_TOKENIZERS = {"tiny-llama": BUNDLED_TINY_MODEL}  # presets whose vocabulary matches a bundled tokenizer


def resolve_model(model: str | Path) -> tuple[str, dict | Path]:
    """('preset', config dict) for a preset name, ('path', directory) for a checkpoint directory."""
    if str(model) in PRESETS:
        return "preset", PRESETS[str(model)]
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return "path", path
    raise ValueError(f"unknown model {str(model)!r}: neither a preset ({', '.join(PRESETS)}) nor a local "
                     f"directory holding a Hugging Face config.json")
