"""Greedy generation through the whole engine equals transformers' greedy ``generate``, token for token,
whatever the scheduler, token budget (chunking), prefix caching or preemption."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

NEW_TOKENS = 32
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)


def random_prompts(lengths, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(hf_model, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = hf_model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)
            out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def llama_case(hf_checkpoint):
    path, hf_model = hf_checkpoint("llama-gqa")
    prompts = random_prompts([3, 17, 40, 9, 1], hf_model.config.vocab_size, seed=0)
    return path, prompts, hf_greedy(hf_model, prompts)


@pytest.mark.parametrize("scheduler,token_budget", [
    ("splitfuse", 768), ("splitfuse", 5), ("splitfuse", 7), ("splitfuse", 16),
    ("prefill-first", 768), ("decode-first", 768),
])
def test_greedy_matches_transformers(llama_case, scheduler, token_budget):
    path, prompts, expected = llama_case
    llm = LLM(str(path), scheduler=scheduler, token_budget=token_budget, block_size=4, num_kv_blocks=128)
    outputs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert all(o.outputs[0].finish_reason == "length" and o.prompt_token_ids == p for o, p in zip(outputs, prompts))
    if token_budget < 40:  # the 40-token prompt must have been split across passes
        assert outputs[2].metrics.first_token_time > outputs[2].metrics.first_scheduled_time


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_shared_prefixes_with_and_without_prefix_caching(hf_checkpoint, enable_prefix_caching):
    path, hf_model = hf_checkpoint("llama-gqa")
    prefix = random_prompts([21], hf_model.config.vocab_size, seed=5)[0]
    tails = random_prompts([2, 7, 1], hf_model.config.vocab_size, seed=6)
    prompts = [prefix + t for t in tails] + [prefix]
    llm = LLM(str(path), token_budget=8, block_size=4, num_kv_blocks=128,
              enable_prefix_caching=enable_prefix_caching)
    first = llm.generate(prompts[:1], GREEDY)  # computes and publishes the prefix blocks
    rest = llm.generate(prompts[1:], GREEDY)
    assert [o.outputs[0].token_ids for o in first + rest] == hf_greedy(hf_model, prompts)


def test_preemption_keeps_every_token(llama_case):
    path, prompts, expected = llama_case
    # 20 blocks of 4 tokens: the 40-token prompt alone needs 18 by its end, so the others must be preempted
    llm = LLM(str(path), token_budget=16, block_size=4, num_kv_blocks=20)
    outputs = llm.generate(prompts, GREEDY)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    assert [o.outputs[0].token_ids for o in outputs] == expected


@pytest.mark.parametrize("family", ["qwen2", "opt", "llama3-rope"])
def test_other_families_generate_like_transformers_under_chunking(hf_checkpoint, family):
    path, hf_model = hf_checkpoint(family)
    prompts = random_prompts([11, 4, 23], hf_model.config.vocab_size, seed=2)
    llm = LLM(str(path), token_budget=7, block_size=4, num_kv_blocks=64)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == hf_greedy(hf_model, prompts)


def test_engine_streams_one_token_per_step_and_aborts(hf_checkpoint):
    from engine import LLMEngine

    path, hf_model = hf_checkpoint("llama-gqa")
    engine = LLMEngine(str(path), token_budget=16, block_size=4, num_kv_blocks=64)
    prompts = random_prompts([6, 30], hf_model.config.vocab_size, seed=3)
    keep = engine.add_request(prompts[0], GREEDY)
    dropped = engine.add_request(prompts[1], GREEDY)
    streamed, finished, aborted = [], None, False
    while engine.has_unfinished():
        for out in engine.step():
            assert not (aborted and out.request_id == dropped)
            if out.request_id == keep:
                streamed += out.new_token_ids
                finished = out if out.finished else finished
        if len(streamed) >= 3 and not aborted:
            assert engine.abort(dropped)
            aborted = True
    assert not engine.abort(dropped) and engine.stats().num_free_blocks == 64
    assert streamed == finished.outputs[0].token_ids == hf_greedy(hf_model, prompts[:1])[0]


def test_generate_cli_on_the_bundled_checkpoint():
    """The bundled tiny-llama (trained on a few sentences) and its tokenizer load and complete a sentence."""
    from click.testing import CliRunner

    from engine.generate_cli import generate

    result = CliRunner().invoke(generate, ["--prompt", "The quick brown", "--prompt", "Once upon a",
                                           "--num-kv-blocks", "32", "--token-budget", "8"])
    assert result.exit_code == 0, result.output
    assert "'The quick brown' -> ' fox jumps over the lazy dog.'" in result.output
    assert "tokens/s" in result.output
