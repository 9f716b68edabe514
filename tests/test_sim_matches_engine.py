"""The design's central claim on the CPU: the simulator runs the engine's own passes.

One offline workload (every request at t=0, greedy, ``ignore_eos``, fixed output lengths) goes through the real
``LLMEngine`` (the ``tiny-llama`` preset on the CPU) and through ``sim.cluster.simulate`` on one replica whose
cost model has the engine's capacities (block size, number of KV blocks, context limit), with the same scheduler
name, token budget and ``max_num_seqs``.
Both sides record every plan (the engine's scheduler's ``observe``, the simulator's ``on_pass``).
The two runs must have the same number of passes and, pass by pass, the same (request index, new tokens, start
position) entries in the same order and the same preempted requests; at the end every request has the same
preemption count and its full output. Request ids are mapped by submission order (the engine's "0", "1", ...
and the simulator's row index). A tiny token budget chunks the prompts; a tight KV cache forces preemptions.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.llm import LLMEngine
from engine.policy import PolicyConfig, SamplingParams
from sim.cluster import ClusterConfig, simulate
from sim.costs import ConstantCost
from sim.workload import RequestTable

MODEL = "tiny-llama"
VOCAB = 320  # the tiny-llama preset's vocabulary
NUM_REQUESTS = 12


def workload(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts (random token ids, so no two share a prefix block) of 5-60 tokens and outputs of 3-20."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(5, 60))] for _ in range(NUM_REQUESTS)]
    outputs = [rng.randint(3, 20) for _ in range(NUM_REQUESTS)]
    return prompts, outputs


def recorder(index_of, passes: list, requests: dict):
    """A plan observer that appends each plan's entries and preempted requests to ``passes``, with requests named
    by ``index_of(request)``; ``requests`` collects index -> Request."""
    def record(plan) -> None:
        for r in plan.requests:
            requests[index_of(r)] = r
        passes.append((
            [(index_of(r), n, s) for r, n, s in zip(plan.requests, plan.num_new_tokens, plan.start_positions)],
            [index_of(r) for r in plan.preempted]))

    return record


def run_engine(prompts, outputs, scheduler, token_budget, max_num_seqs, block_size, num_kv_blocks,
               max_model_len=None):
    engine = LLMEngine(MODEL, scheduler=scheduler, token_budget=token_budget, block_size=block_size,
                       max_num_seqs=max_num_seqs, num_kv_blocks=num_kv_blocks, device="cpu", dtype="float32",
                       seed=0, max_model_len=max_model_len)
    passes: list = []
    requests: dict = {}
    engine.scheduler.observe(recorder(lambda r: int(r.request_id), passes, requests))
    for i, (prompt, n) in enumerate(zip(prompts, outputs)):
        rid = engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                                 arrival_time=0.0)
        assert rid == str(i)
    outputs_seen = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outputs_seen[int(out.request_id)] = len(out.outputs[0].token_ids)
    assert outputs_seen == dict(enumerate(expected_outputs(prompts, outputs, engine.max_model_len)))
    return passes, requests, engine.max_model_len


def expected_outputs(prompts, outputs, max_model_len) -> list[int]:
    """Each request's output tokens: its max_tokens, or fewer where prompt and output reach the context limit."""
    return [min(n, max_model_len - len(p)) for p, n in zip(prompts, outputs)]


def run_sim(prompts, outputs, scheduler, token_budget, max_num_seqs, block_size, num_kv_blocks, max_model_len):
    passes: list = []
    requests: dict = {}
    record = recorder(lambda r: r.request_id, passes, requests)
    cost = ConstantCost(1e-3, block_size=block_size, num_kv_blocks=num_kv_blocks, max_model_len=max_model_len)
    table = RequestTable(arrivals=np.zeros(len(prompts)), prompt_tokens=np.array([len(p) for p in prompts]),
                         output_tokens=np.array(outputs))
    policy = PolicyConfig(scheduler=scheduler, token_budget=token_budget, max_num_seqs=max_num_seqs)
    config = ClusterConfig(cost, replicas=1, noise=False, policy=policy)
    result = simulate(table, config, seed=0, on_pass=lambda replica, plan, start, end, delivered: record(plan))
    df = result.requests.sort_values("id")
    assert df["output_tokens"].tolist() == expected_outputs(prompts, outputs, max_model_len)
    assert result.replicas["passes"].tolist() == [len(passes)]
    return passes, requests


# (scheduler, token budget, max_num_seqs, block size, KV blocks, expect preemptions, context limit or None)
CASES = {
    "splitfuse-roomy": ("splitfuse", 16, 256, 4, 512, False, None),
    "splitfuse-tight-kv": ("splitfuse", 16, 256, 4, 24, True, None),
    "splitfuse-few-seqs": ("splitfuse", 16, 3, 8, 256, False, None),
    "prefill-first-tight-kv": ("prefill-first", 80, 256, 4, 26, True, None),
    "decode-first-tight-kv": ("decode-first", 80, 256, 4, 26, True, None),
    # the limit ends the longest prompts' outputs early, on both sides
    "splitfuse-context-limit": ("splitfuse", 16, 256, 4, 512, False, 64),
}


@pytest.mark.parametrize("case", list(CASES))
def test_simulator_runs_the_engines_passes(case):
    scheduler, budget, max_num_seqs, block_size, num_kv_blocks, expect_preemptions, limit = CASES[case]
    prompts, outputs = workload()
    engine_passes, engine_requests, max_model_len = run_engine(prompts, outputs, scheduler, budget, max_num_seqs,
                                                               block_size, num_kv_blocks, limit)
    if limit is not None:
        assert expected_outputs(prompts, outputs, limit) != outputs  # some request really reaches the limit
    sim_passes, sim_requests = run_sim(prompts, outputs, scheduler, budget, max_num_seqs, block_size, num_kv_blocks,
                                       max_model_len)

    if scheduler == "splitfuse":  # the budget really chunks prompts
        assert any(n < len(prompts[i]) for entries, _ in engine_passes for i, n, s in entries if s == 0)
    for k, (e, s) in enumerate(zip(engine_passes, sim_passes)):
        assert e == s, f"pass {k} differs: engine (entries, preempted) {e} vs simulator {s}"
    assert len(engine_passes) == len(sim_passes)

    engine_preemptions = [engine_requests[i].num_preemptions for i in range(NUM_REQUESTS)]
    sim_preemptions = [sim_requests[i].num_preemptions for i in range(NUM_REQUESTS)]
    assert engine_preemptions == sim_preemptions
    assert (sum(engine_preemptions) > 0) == expect_preemptions


class GreedyConstantCost(ConstantCost):
    """``ConstantCost`` that prices greedy decode steps (``Profile.greedy_seconds``): a simulated replica then
    enqueues decode passes ahead as the engine does."""

    def greedy_seconds(self, features, kind: str, price: float) -> float | None:
        if features.num_tokens != features.num_seqs:
            return None
        return {"step": 1.0, "ahead": 0.5, "discarded": 0.25}[kind] * price


@pytest.mark.parametrize("case", ["splitfuse-roomy", "splitfuse-few-seqs", "splitfuse-tight-kv"])
def test_simulator_enqueues_decode_passes_ahead_as_the_engine_does(case, tmp_path):
    """Greedy requests (temperature 0, sent as a trace at t=0): the engine on the CPU with its pass graphs (run
    eagerly) enqueues decode passes ahead; the simulator, on a cost that prices them, must enqueue, use and discard
    the same ones, over the very same plans."""
    from sim.workload import Workload

    scheduler, budget, max_num_seqs, block_size, num_kv_blocks, _, _ = CASES[case]
    prompts, outputs = workload(1)
    engine = LLMEngine(MODEL, scheduler=scheduler, token_budget=budget, block_size=block_size,
                       max_num_seqs=max_num_seqs, num_kv_blocks=num_kv_blocks, device="cpu", dtype="float32", seed=0)
    engine.runner.rebuild_graphs(min(max_num_seqs, budget), budget)
    engine_passes: list = []
    engine.scheduler.observe(recorder(lambda r: int(r.request_id), engine_passes, {}))
    for prompt, n in zip(prompts, outputs):
        engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), arrival_time=0.0)
    while engine.has_unfinished():
        engine.step()

    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n"
                     + "".join(f"0,{len(p)},{n}\n" for p, n in zip(prompts, outputs)))
    sim_passes: list = []
    record = recorder(lambda r: r.request_id, sim_passes, {})
    cost = GreedyConstantCost(1e-3, block_size=block_size, num_kv_blocks=num_kv_blocks,
                              max_model_len=engine.max_model_len)
    config = ClusterConfig(cost, replicas=1, noise=False,
                           policy=PolicyConfig(scheduler=scheduler, token_budget=budget, max_num_seqs=max_num_seqs))
    result = simulate(Workload(trace=str(trace), temperature=0.0), config, seed=0,
                      on_pass=lambda replica, plan, start, end, delivered: record(plan))

    assert engine.pipeline_stats["used"] > 0  # the case really runs decode passes ahead
    sim_stats = result.replicas[["ahead_enqueued", "ahead_used", "ahead_discarded"]].iloc[0].tolist()
    assert sim_stats == [engine.pipeline_stats[k] for k in ("enqueued", "used", "discarded")]
    assert sim_passes == engine_passes
    # at temperature 1 the same cost enqueues nothing ahead
    sampled = simulate(Workload(trace=str(trace)), config, seed=0)
    assert sampled.replicas["ahead_enqueued"].tolist() == [0]
