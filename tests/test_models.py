"""Our models against transformers: same logits from the same save_pretrained checkpoint; configs; presets."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from conftest import TINY_CONFIGS

from engine.models.config import ModelConfig
from engine.models.layers import AttentionMetadata, rope_inv_freq
from engine.presets import PRESETS
from engine.weights import build_model, load_model, load_weights


def run_prefill(model, config: ModelConfig, token_ids: torch.Tensor, chunks: list[int], block_size: int = 4):
    """Feed ``token_ids`` as consecutive chunks through the paged cache; returns logits of every position."""
    num_blocks = -(-len(token_ids) // block_size) + 2
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_layers)]
    # a scrambled block table, to catch any code that assumes contiguous blocks
    table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).to(torch.int32)
    logits, start = [], 0
    for n in chunks:
        pos = torch.arange(start, start + n)
        meta = AttentionMetadata(slot_mapping=table[pos // block_size].long() * block_size + pos % block_size,
                                 block_tables=table[None], context_lens=torch.tensor([start + n], dtype=torch.int32),
                                 query_start_loc=torch.tensor([0, n], dtype=torch.int32))
        with torch.inference_mode():
            logits.append(model.compute_logits(model(token_ids[start:start + n], pos, kv, meta)))
        start += n
    return torch.cat(logits)


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("family", list(TINY_CONFIGS))
def test_logits_match_transformers(family, hf_checkpoint):
    path, hf_model = hf_checkpoint(family)
    config = ModelConfig.from_path(path)
    model = build_model(config, torch.float32, "cpu")
    load_weights(model, path, config.model_type)
    token_ids = torch.randint(3, config.vocab_size, (37,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf_model(token_ids[None]).logits[0]
    assert relative_error(run_prefill(model, config, token_ids, [37]), ref) < 1e-4
    # the same sequence in uneven chunks reads the earlier chunks back from the paged cache
    assert relative_error(run_prefill(model, config, token_ids, [5, 1, 13, 18]), ref) < 1e-4


def test_config_reads_gqa_bias_and_rope(hf_checkpoint):
    qwen = ModelConfig.from_path(hf_checkpoint("qwen2")[0])
    assert (qwen.num_heads, qwen.num_kv_heads, qwen.qkv_bias, qwen.o_bias) == (4, 2, True, False)
    assert qwen.rope_theta == 1000000.0
    llama3 = ModelConfig.from_path(hf_checkpoint("llama3-rope")[0])
    assert llama3.rope_scaling["rope_type"] == "llama3" and llama3.rope_theta == 500000.0
    # the tiny llama3 config really exercises the scaling: its frequencies differ from plain rotary
    scaled = rope_inv_freq(llama3.head_dim, llama3.rope_theta, llama3.rope_scaling)
    plain = rope_inv_freq(llama3.head_dim, llama3.rope_theta, None)
    assert not torch.allclose(scaled, plain)
    opt = ModelConfig.from_path(hf_checkpoint("opt-post-ln")[0])
    assert (opt.do_layer_norm_before, opt.word_embed_proj_dim, opt.hidden_act) == (False, 32, "relu")


def test_legacy_rope_keys_and_sliding_window_cap():
    base = {**PRESETS["tiny-llama"], "model_type": "mistral", "max_position_embeddings": 1024}
    legacy = ModelConfig.from_dict({**base, "rope_theta": 5e5,
                                    "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert legacy.rope_theta == 5e5 and legacy.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    # a window shorter than the context: served exactly by capping the model length at the window
    assert ModelConfig.from_dict({**base, "sliding_window": 256}).max_model_len == 256
    assert ModelConfig.from_dict({**base, "sliding_window": None}).max_model_len == 1024
    with pytest.raises(ValueError, match="dynamic"):
        ModelConfig.from_dict({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})


def test_unknown_model_type_names_it_and_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "vocab_size": 10}))
    with pytest.raises(ValueError, match="gpt_neox.*llama.*opt"):
        load_model(tmp_path, torch.float32, "cpu")


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError, match="no-such-model.*llama-2-7b.*opt-13b"):
        load_model("no-such-model", torch.float32, "cpu")


def test_sharded_checkpoint_loads(hf_checkpoint, tmp_path):
    path, hf_model = hf_checkpoint("llama")
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    model, config, tokenizer = load_model(tmp_path, torch.float32, "cpu")
    reference = build_model(config, torch.float32, "cpu")
    load_weights(reference, path, config.model_type)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert tokenizer is None


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "tiny-llama"])
def test_presets_have_the_shapes_transformers_builds(preset):
    """Built on the meta device: our parameter shapes equal those transformers builds from the same config."""
    cfg = dict(PRESETS[preset])
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
        ours = build_model(ModelConfig.from_dict(PRESETS[preset]), torch.bfloat16, "meta")
    hf_shapes = {n: tuple(p.shape) for n, p in hf_model.named_parameters()}
    our_shapes = {n: tuple(p.shape) for n, p in ours.named_parameters()}
    assert our_shapes == hf_shapes


def test_random_init_is_seeded_and_in_the_requested_dtype():
    a, _, _ = load_model("tiny-llama", torch.bfloat16, "cpu", seed=3)
    b, _, _ = load_model("tiny-llama", torch.bfloat16, "cpu", seed=3)
    c, _, _ = load_model("tiny-llama", torch.bfloat16, "cpu", seed=4)
    wa, wb, wc = (m.model.layers[0].self_attn.q_proj.weight for m in (a, b, c))
    assert wa.dtype == torch.bfloat16 and torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert 0.015 < wa.float().std().item() < 0.025
    assert a.model.layers[0].self_attn.rotary.cos_sin_cache.dtype == torch.float32
