"""Decode passes enqueued ahead (``LLMEngine(pipeline_decodes=True)``), on the CPU through
``PassGraphs(capture=False)``: the engine must schedule the very same plans and produce the very same tokens as
without them, whatever happens between steps (arrivals, aborts, requests stopping on a token, on length, or held
back by ``min_tokens``)."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams


def make_engine(pipeline: bool, max_num_seqs: int = 6, scheduler: str = "splitfuse",
                num_kv_blocks: int = 200) -> LLMEngine:
    engine = LLMEngine("tiny-llama", device="cpu", dtype="float32", token_budget=32, block_size=4,
                       num_kv_blocks=num_kv_blocks, max_num_seqs=max_num_seqs, pipeline_decodes=pipeline,
                       scheduler=scheduler)
    engine.runner.rebuild_graphs(max_num_seqs, 32)
    return engine


def drive(engine: LLMEngine, events: dict[int, list]) -> tuple[dict, list]:
    """Run until done, applying ``events[step]`` (("add", id, prompt, params) or ("abort", id)) before each step;
    returns every request's tokens and finish reason, and each pass's plan as (request id, position) pairs."""
    plans, results = [], {}
    engine.scheduler.observe(lambda plan: plans.append(
        [(r.request_id, p, n) for r, p, n in zip(plan.requests, plan.start_positions, plan.num_new_tokens)]))
    step = 0
    while step <= max(events) or engine.has_unfinished():
        for event in events.get(step, []):
            if event[0] == "add":
                engine.add_request(event[2], event[3], request_id=event[1])
            else:
                engine.abort(event[1])
        for out in engine.step():
            results[out.request_id] = (out.outputs[0].token_ids, out.outputs[0].finish_reason)
        step += 1
    return results, plans


def scenario(seed: int, stop_tokens: dict[str, int] | None = None) -> dict[int, list]:
    g = torch.Generator().manual_seed(seed)
    events: dict[int, list] = {}
    for i in range(7):
        step = int(torch.randint(0, 40, (1,), generator=g))
        prompt = torch.randint(3, 300, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
        stop = [stop_tokens[str(i)]] if stop_tokens and str(i) in stop_tokens else []
        params = SamplingParams(max_tokens=int(torch.randint(2, 30, (1,), generator=g)), temperature=0,
                                ignore_eos=True, stop_token_ids=stop, min_tokens=2 if i == 3 else 0)
        events.setdefault(step, []).append(("add", str(i), prompt, params))
    events.setdefault(int(torch.randint(5, 50, (1,), generator=g)), []).append(("abort", "5"))
    return events


@pytest.mark.parametrize("seed,scheduler,num_kv_blocks", [
    (0, "splitfuse", 200), (1, "splitfuse", 200), (2, "splitfuse", 200), (3, "splitfuse", 200),
    (7, "splitfuse", 12), (6, "prefill-first", 12), (6, "prefill-first", 200)])
def test_pipelined_engine_schedules_and_samples_like_the_plain_one(seed, scheduler, num_kv_blocks):
    """Also with a KV cache of 12 blocks of 4, where requests are preempted and next blocks often run out, and with
    prefill-first (whose plans may give a prompt the blocks a decode would take next: no block is taken early)."""
    def engine(pipeline):
        return make_engine(pipeline, scheduler=scheduler, num_kv_blocks=num_kv_blocks)

    # first without stop tokens, to pick tokens that some requests will then stop on mid-way
    free, _ = drive(engine(False), scenario(seed))
    stops = {rid: toks[len(toks) // 2] for rid, (toks, _) in free.items() if int(rid) % 2 == 0 and len(toks) > 2}
    plain_engine = engine(False)
    plain, plain_plans = drive(plain_engine, scenario(seed, stops))
    piped_engine = engine(True)
    records = []
    piped_engine.trace_passes(records.append)
    piped, piped_plans = drive(piped_engine, scenario(seed, stops))
    assert piped == plain and piped_plans == plain_plans
    assert piped_engine.scheduler.num_preemptions == plain_engine.scheduler.num_preemptions
    if num_kv_blocks == 12:
        assert plain_engine.scheduler.num_preemptions > 0
    engine = piped_engine
    assert "stop" in {reason for _, reason in plain.values()}
    stats = engine.pipeline_stats
    # at most one pass is still ahead at the end (the last request stopped on a token)
    assert stats["used"] > 0 and stats["enqueued"] - stats["used"] - stats["discarded"] in (0, 1)
    # the trace names each step that used a pass ahead and each that discarded one (but a step left with nothing to
    # run, all its requests aborted or done), never both
    assert sum(r.ahead for r in records) == stats["used"] and sum(r.discarded for r in records) <= stats["discarded"]
    assert not any(r.ahead and r.discarded for r in records)


def test_a_request_that_stops_leaves_the_pass_ahead_in_use():
    """Two decoding requests, one stops on a token: the pass enqueued ahead still serves the other."""
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    free, _ = drive(make_engine(pipeline=False), {0: [("add", str(i), p, params) for i, p in enumerate(prompts)]})
    stop = free["0"][0][4]
    with_stop = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=[stop]), params]
    events = {0: [("add", str(i), p, s) for i, (p, s) in enumerate(zip(prompts, with_stop))]}
    plain, _ = drive(make_engine(pipeline=False), events)
    engine = make_engine(pipeline=True)
    used, take = [], engine._take_ahead

    def spy(plan):
        ahead = engine._ahead
        launched, discarded = take(plan)
        if launched is not None:
            used.append((plan.num_seqs, ahead[0].plan.num_seqs))
        return launched, discarded

    engine._take_ahead = spy
    piped, _ = drive(engine, events)
    assert piped == plain and plain["0"][1] == "stop" and len(plain["1"][0]) == 12
    assert (1, 2) in used and engine.pipeline_stats["discarded"] == 0


def test_the_trace_names_the_pass_that_discarded_the_one_ahead():
    """A prompt that arrives while a request decodes: the pass that takes it in discards the decode pass enqueued
    ahead, and its record says so (what a fit of the served greedy passes reads: ``sim.validate.greedy_ratios``)."""
    engine = make_engine(pipeline=True)
    records = []
    engine.trace_passes(records.append)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    drive(engine, {0: [("add", "0", [3, 4, 5, 6, 7], params)], 4: [("add", "1", [8, 9, 10], params)]})
    discarded = [r for r in records if r.discarded]
    assert engine.pipeline_stats["discarded"] == 1 and len(discarded) == 1
    assert discarded[0].features.prefill_tokens == 3 and not discarded[0].ahead
    before = records[records.index(discarded[0]) - 1]
    assert before.path == "decode-graph" and before.features.prefill_tokens == 0


def test_passes_ahead_cross_kv_blocks():
    """One request decoding alone: every pass but the first is enqueued ahead, also when its next token starts a
    new KV block (taken a step early, in the order the scheduler takes it)."""
    engine = make_engine(pipeline=True)
    drive(engine, {0: [("add", "0", [3, 4, 5, 6, 7], SamplingParams(max_tokens=20, temperature=0,
                                                                     ignore_eos=True))]})
    # 19 decode passes; the last one finishes by length, so nothing is enqueued after it
    assert engine.pipeline_stats == {"enqueued": 18, "used": 18, "discarded": 0}


def test_nothing_is_enqueued_ahead_when_sampling_is_not_greedy():
    engine = make_engine(pipeline=True)
    events = {0: [("add", "0", [3, 4, 5], SamplingParams(max_tokens=8, temperature=0.8, seed=1))]}
    drive(engine, events)
    assert engine.pipeline_stats["enqueued"] == 0
