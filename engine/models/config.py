"""The few architecture facts our models need, read from a Hugging Face ``config.json`` (old or new rope keys)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "opt")

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", "factor": ..., ...}; None = plain rotary
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    # OPT only
    do_layer_norm_before: bool = True
    word_embed_proj_dim: int | None = None
    enable_bias: bool = True
    layer_norm_elementwise_affine: bool = True
    remove_final_layer_norm: bool = False

    @property
    def max_model_len(self) -> int:
        """Longest sequence we serve exactly: a sliding window shorter than the context caps it (we attend fully)."""
        if self.sliding_window is not None and self.sliding_window < self.max_position_embeddings:
            return self.sliding_window
        return self.max_position_embeddings

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        model_type = cfg.get("model_type")
        if model_type == "opt":
            return _opt_config(cfg)
        if model_type in ("llama", "mistral", "qwen2"):
            return _llama_config(cfg)
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")

    @classmethod
    def from_path(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))


def _eos_ids(cfg: dict) -> list[int]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from either transformers 5's ``rope_parameters`` or the older theta/rope_scaling keys."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = dict(cfg.get("rope_scaling") or params or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling {rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    scaling["rope_type"] = rope_type
    return theta, scaling


def _llama_config(cfg: dict) -> ModelConfig:
    heads = cfg["num_attention_heads"]
    theta, scaling = _rope(cfg)
    model_type = cfg["model_type"]
    sliding_window = cfg.get("sliding_window")
    if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
        sliding_window = None
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        hidden_act=cfg.get("hidden_act", "silu"),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        sliding_window=sliding_window,
        eos_token_ids=_eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"),
    )


def _opt_config(cfg: dict) -> ModelConfig:
    heads = cfg["num_attention_heads"]
    return ModelConfig(
        model_type="opt",
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["ffn_dim"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=cfg["hidden_size"] // heads,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        hidden_act=cfg.get("activation_function", "relu"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        eos_token_ids=_eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"),
        do_layer_norm_before=bool(cfg.get("do_layer_norm_before", True)),
        word_embed_proj_dim=cfg.get("word_embed_proj_dim") or cfg["hidden_size"],
        enable_bias=bool(cfg.get("enable_bias", True)),
        layer_norm_elementwise_affine=bool(cfg.get("layer_norm_elementwise_affine", True)),
        remove_final_layer_norm=bool(cfg.get("_remove_final_layer_norm", False)),
    )
