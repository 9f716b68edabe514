"""The fleet's router hop (sim.router): what it adds to a simulated request, and where it applies."""

import numpy as np
import pytest

from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import LinearCost
from sim.router import SERVE_ROUTER, RouterCost
from sim.workload import Workload

COST = LinearCost(base=0.004, per_token=2e-5, per_seq=1e-5, block_size=16, num_kv_blocks=4000, max_model_len=4096)
WORKLOAD = Workload(num_requests=200, rate=40.0, prompt="uniform:64:512", output="uniform:8:64")


def _run(replicas: int, router: RouterCost | None):
    config = ClusterConfig(COST, replicas=replicas, policy=PolicyConfig(balancer="least-requests"), noise=False,
                           router=router)
    return simulate(WORKLOAD, config, seed=1).columns


def test_the_router_delays_each_first_token_by_its_hop_both_ways_and_leaves_the_rest():
    """Every arrival reaches the fleet the same time later, so the replicas run the same passes shifted: a first
    token comes exactly in + out later, and the gaps between tokens do not move."""
    hop = RouterCost(admission_s=0.005, delivery_s=0.003)
    plain, routed = _run(2, None), _run(2, hop)
    assert np.array_equal(plain["id"], routed["id"])
    ttft = (routed["first_token"] - routed["arrival"]) - (plain["first_token"] - plain["arrival"])
    assert ttft == pytest.approx(np.full(len(ttft), 0.008), abs=1e-9)
    gaps = (routed["finish"] - routed["first_token"]) - (plain["finish"] - plain["first_token"])
    assert gaps == pytest.approx(np.zeros(len(gaps)), abs=1e-9)
    assert np.array_equal(plain["replica"], routed["replica"])


def test_a_lone_replica_is_served_without_the_router():
    plain, routed = _run(1, None), _run(1, SERVE_ROUTER)
    assert np.array_equal(plain["first_token"], routed["first_token"])
    assert np.array_equal(plain["finish"], routed["finish"])


@pytest.mark.parametrize("field", ["admission_s", "delivery_s"])
def test_a_negative_or_missing_hop_is_refused_by_name(field):
    with pytest.raises(ValueError, match=field):
        RouterCost(**{field: -0.001})
    with pytest.raises(ValueError, match=field):
        RouterCost(**{field: float("nan")})
