"""Sampling: the right support and frequencies for top-k / top-p, greedy, min_tokens, and seeds that give the
same tokens whatever the batch around them."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.policy import Request
from engine.sampler import Sampler, _draw_in_vocab_order

PROBS = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])  # sorted: token 1 (.4), 3 (.3), 4 (.15), 2 (.1), 0 (.05)
DRAWS = 4000


def request(params: SamplingParams, eos_token_id: int | None = None) -> Request:
    return Request("r", [1, 2, 3], params, eos_token_id=eos_token_id)


def frequencies(params: SamplingParams, seed: int = 0) -> torch.Tensor:
    """Empirical distribution of DRAWS samples from PROBS, drawn as one batch of identical rows."""
    sampler = Sampler(seed)
    logits = PROBS.log().repeat(DRAWS, 1)
    tokens = sampler(logits, [request(params)] * DRAWS)
    return torch.bincount(torch.tensor(tokens), minlength=len(PROBS)).float() / DRAWS


def expected(kept: list[int]) -> torch.Tensor:
    p = torch.zeros_like(PROBS)
    p[kept] = PROBS[kept]
    return p / p.sum()


@pytest.mark.parametrize("params,kept", [
    (SamplingParams(), [0, 1, 2, 3, 4]),
    (SamplingParams(top_k=2), [1, 3]),
    (SamplingParams(top_k=1), [1]),
    (SamplingParams(top_p=0.69), [1, 3]),  # .4 + .3 passes .69: token 4 is left out
    (SamplingParams(top_p=0.71), [1, 3, 4]),
    (SamplingParams(top_p=0.9, top_k=3), [1, 3, 4]),
    (SamplingParams(top_p=0.3), [1]),  # the top token always stays
])
def test_support_and_frequencies(params, kept):
    freq = frequencies(params)
    assert set(torch.nonzero(freq).flatten().tolist()) == set(kept)
    # 4000 draws: a standard error of at most 0.008 per token, so 0.035 is over four of them
    assert (freq - expected(kept)).abs().max() < 0.035


def test_a_batch_of_truncating_and_whole_rows_draws_each_from_its_own_support():
    sampler = Sampler(0)
    logits = PROBS.log().repeat(2 * DRAWS, 1)
    params = [SamplingParams(top_k=2), SamplingParams()] * DRAWS
    tokens = torch.tensor(sampler(logits, [request(p) for p in params]))
    for share, kept in ((tokens[0::2], [1, 3]), (tokens[1::2], [0, 1, 2, 3, 4])):
        freq = torch.bincount(share, minlength=len(PROBS)).float() / DRAWS
        assert set(torch.nonzero(freq).flatten().tolist()) == set(kept)
        assert (freq - expected(kept)).abs().max() < 0.035


def test_a_draw_in_vocabulary_order_never_lands_on_a_token_held_back():
    scaled = torch.tensor([[float("-inf"), 1.0, 2.0, float("-inf")]]).repeat(3, 1)
    u = torch.tensor([0.0, 1 - 2 ** -24, 1.0])  # the bottom of the mass, its top, and one rounded past it
    assert _draw_in_vocab_order(scaled, u).tolist() == [1, 2, 2]


def test_temperature_sharpens_and_flattens():
    cold = frequencies(SamplingParams(temperature=0.25))
    hot = frequencies(SamplingParams(temperature=4.0))
    p_cold = PROBS ** 4 / (PROBS ** 4).sum()
    p_hot = PROBS ** 0.25 / (PROBS ** 0.25).sum()
    assert (cold - p_cold).abs().max() < 0.035 and (hot - p_hot).abs().max() < 0.035


def test_greedy_rows_take_the_argmax_beside_random_rows():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    reqs = [request(SamplingParams(temperature=0 if i % 2 else 1.0)) for i in range(6)]
    tokens = Sampler(0)(logits.clone(), reqs)
    assert tokens[1::2] == logits[1::2].argmax(-1).tolist()


def test_min_tokens_holds_back_eos_and_stop_tokens():
    logits = torch.tensor([[0.0, 9.0, 8.0, 1.0]])
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[2])
    assert Sampler(0)(logits.clone(), [request(params, eos_token_id=1)]) == [3]
    done = request(params, eos_token_id=1)
    done.output_token_ids, done.num_output_tokens = [3, 3], 2
    assert Sampler(0)(logits.clone(), [done]) == [1]


def test_an_argmax_taken_in_the_graph_serves_only_all_greedy_batches_without_hold_backs():
    logits = torch.tensor([[0.0, 9.0, 8.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    given = torch.tensor([2, 3])  # not the logits' argmax: shows which path answered
    greedy = SamplingParams(temperature=0)
    assert Sampler(0)(logits.clone(), [request(greedy), request(greedy)], given) == [2, 3]
    held = request(SamplingParams(temperature=0, min_tokens=1), eos_token_id=1)
    assert Sampler(0)(logits.clone(), [held, request(greedy)], given) == [2, 0]  # EOS held back: from the logits
    assert Sampler(0)(logits.clone(), [request(SamplingParams(top_k=1)), request(greedy)], given) == [1, 0]


def test_seeded_rows_do_not_depend_on_the_batch_or_the_engine_seed():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(1))
    seeded = request(SamplingParams(seed=7))
    alone = Sampler(0)(logits.clone(), [seeded])
    others = [request(SamplingParams()) for _ in range(3)]
    batched = Sampler(123)(logits.repeat(4, 1), others[:2] + [seeded] + others[2:])
    assert batched[2] == alone[0]


@pytest.fixture(scope="module")
def llm(hf_checkpoint):
    return LLM(str(hf_checkpoint("llama-gqa")[0]), token_budget=16, block_size=4, num_kv_blocks=128, seed=0)


def test_seeded_generation_is_reproducible_across_batch_compositions(llm, hf_checkpoint):
    prompt = [5, 17, 33, 8, 90, 12, 4]
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = llm.generate([prompt], params)[0].outputs[0].token_ids
    filler = SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True)
    crowd = llm.generate([[9] * 30, prompt, [3, 4]], [filler, params, filler])[1].outputs[0].token_ids
    other_engine = LLM(str(hf_checkpoint("llama-gqa")[0]), token_budget=5, block_size=4, num_kv_blocks=128,
                       seed=99)
    assert alone == crowd == other_engine.generate([prompt], params)[0].outputs[0].token_ids
    different_seed = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=4321, ignore_eos=True)
    assert llm.generate([prompt], different_seed)[0].outputs[0].token_ids != alone


def test_unseeded_requests_follow_the_engine_seed(hf_checkpoint):
    path = str(hf_checkpoint("llama-gqa")[0])
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9]]

    def run(seed):
        engine = LLM(path, block_size=4, num_kv_blocks=64, seed=seed)
        return [o.outputs[0].token_ids for o in engine.generate(prompts, params)]

    assert run(0) == run(0) != run(1)


def test_seeded_tokens_survive_preemption(hf_checkpoint):
    path = str(hf_checkpoint("llama-gqa")[0])
    prompts = [[11 + i] * (6 + 5 * i) for i in range(4)]
    params = [SamplingParams(max_tokens=24, temperature=1.0, top_k=20, seed=i, ignore_eos=True) for i in range(4)]
    roomy = LLM(path, token_budget=16, block_size=4, num_kv_blocks=128).generate(prompts, params)
    tight = LLM(path, token_budget=16, block_size=4, num_kv_blocks=16).generate(prompts, params)
    assert sum(o.metrics.num_preemptions for o in tight) > 0
    assert [o.outputs[0].token_ids for o in tight] == [o.outputs[0].token_ids for o in roomy]
