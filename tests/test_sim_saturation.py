"""The simulator's first guess at a saturation rate against the rate its own overload runs sustain."""

import dataclasses

import pytest

from calibration.profile import load_profile
from sim.cluster import ClusterConfig, simulate
from sim.saturation import estimate_capacity
from sim.validate import ServedCost, engine_concurrency, make_cells, overload_requests, steady_throughput


@pytest.mark.parametrize("scheduler,budget,mix", [("splitfuse", 768, "long"), ("splitfuse", 768, "short"),
                                                  ("prefill-first", 4352, "long"),
                                                  ("prefill-first", 4352, "short")])
def test_the_capacity_estimate_is_near_the_simulated_saturation_rate(scheduler, budget, mix):
    """Before, the estimate filled every pass with the token budget: with prefill-first's budget of 4,352 on the short
    mix that is 1,451 decodes a pass against ``max_num_seqs`` 256, and it said 0.4 x the rate the engine reaches."""
    served = ServedCost(load_profile("llama-2-7b-h200"), 14230, 4096)  # the H200 server's KV cache and context
    cell = make_cells([(scheduler, budget)], [mix], [1.0], [], 150, 0)[0]
    config = ClusterConfig(served, 1, cell.policy)
    estimate = estimate_capacity(config, cell.workload(1.0))
    concurrency = engine_concurrency(cell, {"kv_total_blocks": 14230})
    run = dataclasses.replace(cell, load=None, clients=0, seed=7919,
                              num_requests=overload_requests(150, concurrency))
    result = simulate(run.workload(3 * estimate), config, seed=0, workload_seed=run.seed)
    simulated = steady_throughput(result.columns["finish"], concurrency)
    assert estimate == pytest.approx(simulated, rel=0.1)


def test_a_cost_model_that_prices_many_prompts_below_zero_still_gets_an_estimate():
    """A model fitted on a few small passes (as a CPU sweep of the tiny model is) can price a pass of many short
    prompts at <= 0 s: the guess then prices the prompt tokens as one chunk, and says so where even that fails."""
    from engine.policy import PolicyConfig
    from sim.costs import LinearCost
    from sim.workload import Workload

    workload = Workload(prompt="fixed:24", output="fixed:5")
    # 132 decodes and 634 prompt tokens: 27 chunks make 159 sequences (< 0 s), one chunk 133 (> 0 s)
    cost = LinearCost(base=1e-3, per_token=2e-6, per_seq=-1.75e-5, num_kv_blocks=256)
    rate = estimate_capacity(ClusterConfig(cost, 1, PolicyConfig()), workload)
    assert rate == pytest.approx(132 / 5 / (1e-3 + 766 * 2e-6 - 133 * 1.75e-5))
    with pytest.raises(ValueError, match="no capacity can be estimated"):
        estimate_capacity(ClusterConfig(LinearCost(base=-1.0, per_token=0.0), 1, PolicyConfig()), workload)
