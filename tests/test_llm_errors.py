"""Bad input gives an output with a clear error for that prompt only; every other prompt completes as if alone."""

from __future__ import annotations

import pytest

from engine import LLM, LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
GOOD = [[5, 6, 7, 8], [40, 41]]


@pytest.fixture(scope="module")
def llm(hf_checkpoint):
    # max_position_embeddings is 256; 40 blocks of 4 tokens hold 160 tokens
    return LLM(str(hf_checkpoint("llama-gqa")[0]), token_budget=16, block_size=4, num_kv_blocks=40)


@pytest.fixture(scope="module")
def alone(llm):
    return [o.outputs[0].token_ids for o in llm.generate(GOOD, GREEDY)]


@pytest.mark.parametrize("bad_prompt,bad_params,message", [
    ([], GREEDY, "prompt is empty"),
    ("", GREEDY, "no tokenizer"),  # this checkpoint has no tokenizer, so any string is refused
    ([5] * 300, GREEDY, "context is 256"),
    ([6] * 200, GREEDY, "cache holds only 40 blocks"),
    ([7, 9999], GREEDY, "outside the vocabulary"),
    ([7, 8], {"max_tokens": 8, "temperature": -1.0}, "temperature"),
    ([7, 8], {"max_tokens": 8, "top_p": 0.0}, "top_p"),
    ([7, 8], {"max_tokens": 8, "top_p": 1.5}, "top_p"),
    ([7, 8], {"max_tokens": 0}, "max_tokens"),
    ([7, 8], {"temperature": 0, "no_such_option": 1}, "no_such_option"),
])
def test_bad_prompt_fails_alone(llm, alone, bad_prompt, bad_params, message):
    outputs = llm.generate([GOOD[0], bad_prompt, GOOD[1]], [GREEDY, bad_params, GREEDY])
    bad = outputs[1]
    assert bad.outputs[0].finish_reason == "error" and message in bad.error and bad.outputs[0].token_ids == []
    assert [outputs[0].outputs[0].token_ids, outputs[2].outputs[0].token_ids] == alone
    assert all(o.outputs[0].finish_reason == "length" and o.error is None for o in (outputs[0], outputs[2]))


def test_mutated_sampling_params_are_checked_again(llm, alone):
    params = SamplingParams(temperature=0.5)
    params.top_p = 2.0  # dataclasses allow this; the engine re-validates its own copy
    outputs = llm.generate([GOOD[0], [7, 8]], [GREEDY, params])
    assert outputs[1].outputs[0].finish_reason == "error" and "top_p" in outputs[1].error
    assert outputs[0].outputs[0].token_ids == alone[0]


def test_engine_add_request_raises_value_error(llm):
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.engine.add_request([], GREEDY)
    rid = llm.engine.add_request([1, 2], GREEDY, request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        llm.engine.add_request([1, 2], GREEDY, request_id="dup")
    assert llm.engine.abort(rid) and not llm.engine.has_unfinished()


def test_mismatched_sampling_params_list(llm):
    with pytest.raises(ValueError, match="2 sampling_params for 3 prompts"):
        llm.generate([[1], [2], [3]], [GREEDY, GREEDY])


@pytest.mark.parametrize("kwargs,message", [
    ({"model": "llama-9000"}, "unknown model 'llama-9000'.*tiny-llama"),
    ({"model": "tiny-llama", "scheduler": "fifo"}, "unknown scheduler 'fifo'"),
    ({"model": "tiny-llama", "dtype": "float8"}, "unknown dtype 'float8'"),
    ({"model": "tiny-llama", "token_budget": 0}, "max_num_batched_tokens.*--token-budget"),
])
def test_bad_engine_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLMEngine(**kwargs, num_kv_blocks=8)
