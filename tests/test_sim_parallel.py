"""Replicas simulated in worker processes give exactly the single-process results (state-free balancers)."""

import numpy as np
import pandas as pd
import pytest

from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import LinearCost
from sim.workload import LengthDist, Workload

COST = LinearCost(base=5e-3, per_token=2e-5, per_decode_context=1e-7, per_attention=1e-9, noise_sigma=0.05,
                  num_kv_blocks=120)  # tight: preemptions happen


@pytest.mark.parametrize("balancer, scheduler", [("round-robin", "splitfuse"), ("random", "splitfuse"),
                                                 ("random", "decode-first")])
def test_worker_processes_give_exactly_the_sequential_results(balancer, scheduler):
    w = Workload(num_requests=1500, rate=90.0, prompt=LengthDist("uniform", (10, 600)),
                 output=LengthDist("uniform", (1, 80)))
    policy = PolicyConfig(balancer=balancer, scheduler=scheduler, token_budget=700)
    config = ClusterConfig(COST, replicas=5, policy=policy)
    one = simulate(w, config, seed=7, warmup=0.1, workers=1)
    two = simulate(w, config, seed=7, warmup=0.1, workers=2)
    assert one.replicas["preemptions"].sum() > 0
    pd.testing.assert_frame_equal(one.requests, two.requests, check_exact=True)
    pd.testing.assert_frame_equal(one.replicas, two.replicas, check_exact=True)
    pd.testing.assert_frame_equal(one.kv, two.kv, check_exact=True)
    assert np.array_equal(one.tokens_per_pass, two.tokens_per_pass)
    assert np.array_equal(one.log.gaps.counts, two.log.gaps.counts)
    assert two.log.gaps.total == pytest.approx(one.log.gaps.total, rel=1e-12)  # a float sum in another order


def test_state_dependent_balancers_stay_in_one_process():
    w = Workload(num_requests=300, rate=60.0, prompt=LengthDist("uniform", (10, 600)),
                 output=LengthDist("uniform", (1, 80)))
    config = ClusterConfig(COST, replicas=3, policy=PolicyConfig(balancer="least-requests", token_budget=700))
    a = simulate(w, config, seed=1, workers=2)
    b = simulate(w, config, seed=1, workers=1)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
