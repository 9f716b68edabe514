"""Queueing theory: with a constant cost per pass, one sequence per pass and one output token, a replica is
an M/D/1 queue, and the random balancer over N replicas makes N independent M/D/1 queues."""

import pytest

from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import ConstantCost
from sim.workload import LengthDist, Workload

SERVICE = 0.5  # seconds per pass


def mean_wait(rho: float, num_requests: int, replicas: int, seed: int) -> float:
    workload = Workload(num_requests=num_requests, rate=rho * replicas / SERVICE, prompt=LengthDist("fixed", (1,)),
                        output=LengthDist("fixed", (1,)))
    config = ClusterConfig(ConstantCost(SERVICE, num_kv_blocks=64), replicas=replicas, noise=False,
                           policy=PolicyConfig(max_num_seqs=1, balancer="random"))
    result = simulate(workload, config, seed=seed, warmup=0.01)
    m = result.requests[result.requests["measured"]]
    assert (m["finish"] - m["scheduled"]).round(9).eq(SERVICE).all(), "service time is not deterministic"
    return float(m["queue_delay"].mean())


@pytest.mark.parametrize("rho, num_requests, replicas", [(0.3, 200_000, 1), (0.6, 200_000, 4), (0.8, 600_000, 4)])
def test_mean_wait_matches_md1(rho, num_requests, replicas):
    expected = rho * SERVICE / (2 * (1 - rho))  # Pollaczek-Khinchine for deterministic service
    got = mean_wait(rho, num_requests, replicas, seed=1)
    assert got == pytest.approx(expected, rel=0.03), (got, expected)
