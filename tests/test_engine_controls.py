"""The engine's controls for benchmarks, on the CPU: ending a pass trace, device time (None off CUDA), a plan run
without its graph, rebuilt graphs, ``set_max_num_seqs`` and ``close``."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def make_engine(**kwargs) -> LLMEngine:
    return LLMEngine("tiny-llama", device="cpu", dtype="float32", token_budget=32, block_size=4, num_kv_blocks=200,
                     max_num_seqs=6, **kwargs)


def test_a_trace_ends_when_asked_and_has_no_device_time_on_the_cpu():
    engine = make_engine()
    engine.runner.rebuild_graphs(6, 32)  # passes enqueued ahead need decode graphs
    timed, plain = [], []
    untrace = engine.trace_passes(timed.append, device_time=True)
    engine.trace_passes(plain.append)
    engine.add_request([3, 4, 5, 6, 7], GREEDY)
    engine.step()
    engine.step()
    untrace()
    untrace()  # a second call changes nothing
    while engine.has_unfinished():
        engine.step()
    assert len(timed) == 2 and len(plain) == 6
    assert all(r.device_s is None for r in plain) and any(r.ahead for r in plain)


def test_a_plan_runs_without_its_graph_as_with_it():
    engine = make_engine()
    runner = engine.runner
    assert runner.graphs is None  # off CUDA by default
    runner.rebuild_graphs(6, 32)  # the graphs' buffers, run eagerly on the CPU
    assert runner.graphs.max_batch == 6 and runner.graphs.mixed_buckets[-1] == 32
    engine.add_request([3, 4, 5, 6, 7], GREEDY)
    engine.add_request(list(range(10, 30)), GREEDY)
    paths = set()
    while engine.has_unfinished():
        plan = engine.scheduler.schedule()
        paths.add(runner.path(plan))
        eager = runner.run(plan, use_graphs=False)
        assert runner.run(plan) == eager
        launched = runner.launch(plan, timed=True)
        assert launched.result() == eager and launched.device_s() is None
        if plan.num_tokens == plan.num_seqs:
            with pytest.raises(ValueError, match="decode graph"):  # eager: no device input ids
                runner.launch(plan, ids_from=torch.zeros(plan.num_seqs, dtype=torch.int32), use_graphs=False)
        engine.scheduler.update(plan, eager)
    assert paths == {"decode-graph", "mixed-graph"}


def test_max_num_seqs_can_be_lowered_within_what_the_engine_was_built_for():
    engine = make_engine()
    for bad in (0, 7, 2.5, True, "3"):
        with pytest.raises(ValueError, match="from 1 to 6"):
            engine.set_max_num_seqs(bad)
    engine.set_max_num_seqs(2)
    for i in range(4):
        engine.add_request([3 + i, 4, 5], GREEDY)
    running = []
    while engine.has_unfinished():
        engine.step()
        running.append(engine.stats().num_running)
    assert max(running) == 2
    engine.set_max_num_seqs(6)


def test_a_closed_engine_refuses_to_step():
    engine = make_engine()
    engine.add_request([3, 4, 5], GREEDY)
    engine.step()
    engine.close()
    assert engine.model is None and engine.runner.model is None and engine.runner.kv_cache is None
    with pytest.raises(RuntimeError, match="closed"):
        engine.step()


def test_graphs_rebuild_with_given_mixed_buckets_and_replay_only_a_captured_graph():
    engine = make_engine()
    runner = engine.runner
    engine.add_request([3, 4, 5, 6, 7], GREEDY)
    plan = engine.scheduler.schedule()
    with pytest.raises(ValueError, match="no pass graphs"):
        runner.replay_graph(plan)
    runner.rebuild_graphs(6, 32, mixed_buckets=(8, 24))
    assert runner.graphs.mixed_buckets == [8, 24, 32]
    runner.rebuild_graphs(6, 32)
    assert runner.graphs.mixed_buckets == [16, 32]  # the engine's buckets below 32
    runner.run(plan)
    with pytest.raises(ValueError, match="no captured graph runs a pass of 5 tokens"):  # off CUDA none is captured
        runner.replay_graph(plan)


def test_stats_count_the_tokens_whose_kv_is_cached():
    engine = make_engine()
    engine.add_request([3, 4, 5, 6, 7], GREEDY)
    engine.add_request(list(range(10, 50)), GREEDY)  # 40 tokens: a 27-token chunk fits the 32-token budget first
    assert engine.stats().num_computed_tokens == 0
    engine.step()
    assert engine.stats().num_computed_tokens == 32
    engine.step()  # the rest of the long prompt, a decode of the short one
    assert engine.stats().num_computed_tokens == 46
