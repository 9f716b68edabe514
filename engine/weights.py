"""Build models without touching memory twice, load Hugging Face safetensors by name, or random-initialize.

Models are built on the ``meta`` device and materialized straight into the target dtype and device, so a 7B
preset costs one allocation and one pass of initialization or copying.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from engine.models import model_class
from engine.models.config import ModelConfig

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved; we rebuild them


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """An uninitialized model with parameters in ``dtype`` on ``device`` (fill it with ``load_weights`` or
    ``random_init``)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = model_class(config.model_type)(config)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives tied parameters separate storage
    for module in model.modules():  # rotary tables were left on meta; rebuild them for real
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()
    return model.eval().requires_grad_(False)


@torch.no_grad()
def random_init(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Normal(0, std) weights, zero biases, unit norms, drawn in place on the model's device from ``seed``
    (the same seed gives the same model on the same kind of device)."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():  # named_parameters visits tied weights once
        if name.endswith("bias"):
            param.zero_()
        elif "norm" in name:
            param.fill_(1.0)
        else:
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            param.normal_(0.0, std, generator=generators[param.device])


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, through the shard index when there is one."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path} (only safetensors checkpoints are supported)")
    return files


def our_name(hf_name: str, model_type: str) -> str:
    """Our parameter name for a checkpoint name (they match, except OPT checkpoints without the model. prefix)."""
    if model_type == "opt" and hf_name.startswith("decoder."):
        return "model." + hf_name
    return hf_name


@torch.no_grad()
def load_weights(model: nn.Module, path: str | Path, model_type: str) -> None:
    """Copy every tensor of the checkpoint into the model (casting to the model's dtype); fail on a gap."""
    from safetensors import safe_open

    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in checkpoint_files(Path(path)):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for hf_name in f.keys():
                if hf_name.endswith(IGNORED_SUFFIXES):
                    continue
                name = our_name(hf_name, model_type)
                if name not in params:
                    raise ValueError(f"checkpoint tensor {hf_name!r} in {file.name} has no place in our "
                                     f"{model_type} model")
                tensor = f.get_tensor(hf_name)
                if tensor.shape != params[name].shape:
                    raise ValueError(f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                                     f"expected {tuple(params[name].shape)}")
                params[name].copy_(tensor)
                loaded.add(name)
    tied = {name for name, p in params.items() if name not in loaded and any(p is params[n] for n in loaded)}
    missing = sorted(set(params) - loaded - tied)
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} tensors, e.g. {missing[:3]}")


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer via transformers' AutoTokenizer, or None when it ships no tokenizer files."""
    path = Path(path)
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


def load_model(model: str | Path, dtype: torch.dtype, device: torch.device | str, seed: int = 0):
    """(module, ModelConfig, tokenizer or None) for a preset name (random weights from ``seed``) or a
    checkpoint directory."""
    from engine.presets import PRESET_TOKENIZERS, resolve_model

    kind, source = resolve_model(model)
    if kind == "preset":
        config = ModelConfig.from_dict(source)
        module = build_model(config, dtype, device)
        random_init(module, seed)
        tokenizer_dir = PRESET_TOKENIZERS.get(str(model))
        return module, config, load_tokenizer(tokenizer_dir) if tokenizer_dir else None
    config = ModelConfig.from_path(source)
    module = build_model(config, dtype, device)
    load_weights(module, source, config.model_type)
    return module, config, load_tokenizer(source)
