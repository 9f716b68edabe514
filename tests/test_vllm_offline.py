"""vLLM's offline interface carries over: ``RequestOutput.outputs`` holds ``CompletionOutput``s, ``stop`` strings
and ``stop_token_ids`` end the text as in vLLM, prompts may be ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}``
dicts, ``n`` samples come back as ``n`` completions, and ``max_num_batched_tokens`` names the token budget (the
old ``token_budget`` still works)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from engine import LLM, CompletionOutput, LLMEngine, RequestOutput, SamplingParams
from engine.config import EngineConfig
from engine.policy import PolicyConfig

PROMPT = "Hello, my name is"
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-llama", device="cpu", dtype="float32", max_num_batched_tokens=64, block_size=4,
               num_kv_blocks=400)


@pytest.fixture(scope="module")
def free_run(llm):
    """The greedy completion of PROMPT without stops."""
    return llm.generate(PROMPT, GREEDY)[0].outputs[0]


def test_outputs_hold_completion_outputs(llm, free_run):
    out = llm.generate([PROMPT], GREEDY)[0]
    assert isinstance(out, RequestOutput) and out.finished and out.prompt == PROMPT
    assert out.prompt_token_ids == llm.tokenizer(PROMPT)["input_ids"]
    (sample,) = out.outputs
    assert isinstance(sample, CompletionOutput) and sample.index == 0 and sample.finish_reason == "length"
    assert len(sample.token_ids) == 24 and sample.cumulative_logprob is None
    assert sample.text == llm.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
    assert out.metrics.ttft > 0 and out.metrics.e2e >= out.metrics.ttft


def test_stop_string_ends_the_text_before_it(llm, free_run):
    stop = free_run.text[8:12]
    cut = free_run.text.find(stop)  # the first place it appears
    params = dataclasses.replace(GREEDY, stop=[stop, "never appears \x00"])
    sample = llm.generate(PROMPT, params)[0].outputs[0]
    assert sample.finish_reason == "stop" and sample.stop_reason == stop
    assert sample.text == free_run.text[:cut]
    # generation ended at the token that completed the stop string: fewer tokens than the free run's 24
    assert sample.token_ids == free_run.token_ids[:len(sample.token_ids)] and len(sample.token_ids) < 24


def test_stop_string_as_a_single_string(llm, free_run):
    stop = free_run.text[3:6]
    sample = llm.generate(PROMPT, dataclasses.replace(GREEDY, stop=stop))[0].outputs[0]
    assert sample.finish_reason == "stop" and sample.text == free_run.text[:free_run.text.find(stop)]


def test_stop_token_ids_end_the_request(llm, free_run):
    token = free_run.token_ids[5]
    first = free_run.token_ids.index(token)
    sample = llm.generate(PROMPT, dataclasses.replace(GREEDY, stop_token_ids=[token]))[0].outputs[0]
    assert sample.finish_reason == "stop" and sample.stop_reason == token
    assert sample.token_ids == free_run.token_ids[:first + 1]


@pytest.mark.parametrize("bad,field", [({"stop": [""]}, "stop"), ({"stop": [3]}, "stop"),
                                        ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"n": 0}, "n")])
def test_bad_stop_and_n_values_name_the_field(bad, field):
    with pytest.raises(ValueError, match=rf"^{field} must"):
        SamplingParams(**bad)


def test_prompt_dicts_as_vllm_accepts_them(llm, free_run):
    ids = llm.tokenizer(PROMPT)["input_ids"]
    text_out, ids_out, bad = llm.generate([{"prompt": PROMPT}, {"prompt_token_ids": ids}, {"prompt_ids": ids}],
                                          GREEDY)
    assert text_out.prompt == PROMPT and ids_out.prompt is None and ids_out.prompt_token_ids == ids
    assert text_out.outputs[0].token_ids == ids_out.outputs[0].token_ids == free_run.token_ids
    assert bad.outputs[0].finish_reason == "error" and "prompt_ids" in bad.error
    single = llm.generate({"prompt_token_ids": ids}, GREEDY)
    assert len(single) == 1 and single[0].outputs[0].token_ids == free_run.token_ids


def test_n_samples_are_n_seeded_copies(llm):
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7, n=3, ignore_eos=True)
    out = llm.generate(PROMPT, params)[0]
    assert [s.index for s in out.outputs] == [0, 1, 2] and out.finished
    for j, sample in enumerate(out.outputs):
        alone = llm.generate(PROMPT, dataclasses.replace(params, n=1, seed=7 + j))[0].outputs[0]
        assert sample.token_ids == alone.token_ids and len(sample.token_ids) == 8
    assert len({tuple(s.token_ids) for s in out.outputs}) > 1


def test_n_through_the_engine_api_names_n(llm):
    with pytest.raises(ValueError, match="n=2"):
        llm.engine.add_request(PROMPT, SamplingParams(n=2))


def test_max_num_batched_tokens_names_the_budget_and_token_budget_stays_an_alias():
    assert PolicyConfig(max_num_batched_tokens=96) == PolicyConfig(token_budget=96)
    assert PolicyConfig(token_budget=96).token_budget == 96
    config = EngineConfig.from_kwargs("tiny-llama", token_budget=48)
    assert config.policy.max_num_batched_tokens == 48
    assert dataclasses.replace(PolicyConfig(token_budget=96), max_num_batched_tokens=8).max_num_batched_tokens == 8
    with pytest.raises(ValueError, match="token_budget is another name for max_num_batched_tokens"):
        PolicyConfig(token_budget=8, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="--max-num-batched-tokens, alias --token-budget"):
        PolicyConfig(max_num_batched_tokens=0)


def test_engine_takes_max_num_batched_tokens():
    engine = LLMEngine("tiny-llama", device="cpu", dtype="float32", max_num_batched_tokens=12, num_kv_blocks=64)
    assert engine.scheduler.token_budget == 12
    engine.add_request(list(range(1, 40)), GREEDY)
    plans = []
    engine.scheduler.observe(lambda plan: plans.append(plan.num_tokens))
    while engine.has_unfinished():
        engine.step()
    assert max(plans) == 12


@pytest.mark.parametrize("flag", ["--max-num-batched-tokens", "--token-budget"])
def test_cli_flags_take_both_names(flag):
    from sim.cli import simulate

    result = CliRunner().invoke(simulate, [flag, "0", "--profile", "builtin-llama-2-7b"])
    assert result.exit_code == 2 and "--max-num-batched-tokens" in result.output
