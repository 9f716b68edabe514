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


def _run(replicas: int, router: RouterCost | None, workload: Workload = WORKLOAD, on_pass=None):
    config = ClusterConfig(COST, replicas=replicas, policy=PolicyConfig(balancer="least-requests"), noise=False,
                           router=router)
    return simulate(workload, config, seed=1, on_pass=on_pass).columns


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


def _open_at_send(columns) -> np.ndarray:
    """For each request, the requests sent before it and not finished when it was sent (``finish`` is when the
    client had the last token; the router's hop out is 0 in these runs, so that is when its stream closed)."""
    arrival, finish = columns["arrival"], columns["finish"]
    return np.array([np.count_nonzero((arrival < t) & (finish > t)) for t in arrival])


def test_the_hop_in_grows_with_the_streams_open_at_the_router_when_a_request_is_sent():
    """A request that finds its replica idle is scheduled the moment it arrives there: its hop in after being sent
    is the router's intercept plus its slope times the streams open then; a busy replica only adds to that."""
    hop = RouterCost(admission_s=0.002, admission_per_stream_s=0.0015)
    workload = Workload(num_requests=300, rate=60.0, prompt="uniform:16:64", output="uniform:4:16")
    columns = _run(8, hop, workload)
    wait = columns["scheduled"] - columns["arrival"]
    expected = 0.002 + 0.0015 * _open_at_send(columns)
    assert (wait >= expected - 1e-9).all()
    exact = np.isclose(wait, expected, rtol=0, atol=1e-9)
    assert exact.mean() > 0.5  # most requests find an idle replica at this load
    assert len(set(np.round(expected[exact], 9))) >= 4  # and were sent with several streams open


def test_a_tokens_hop_out_counts_the_streams_open_then_its_own_among_them():
    hop = RouterCost(delivery_s=0.001, delivery_per_stream_s=2e-4)
    workload = Workload(num_requests=300, rate=60.0, prompt="uniform:16:64", output="uniform:4:16")
    extra = []
    _run(4, hop, workload, on_pass=lambda replica, plan, start, end, delivered: extra.append(delivered - end))
    streams = (np.array(extra) - 0.001) / 2e-4
    assert streams == pytest.approx(np.round(streams), abs=1e-6)
    assert streams.min() >= 1 - 1e-6 and streams.max() <= 300 and len(set(np.round(streams))) >= 4


def test_a_router_hop_that_grows_with_its_streams_keeps_the_run_in_one_process():
    """Worker processes see only their own replicas' streams: such a router keeps a big round-robin run whole,
    with the same result as asked for one process."""
    hop = RouterCost(admission_s=0.001, admission_per_stream_s=1e-4, delivery_per_stream_s=1e-4)
    config = ClusterConfig(COST, replicas=4, policy=PolicyConfig(balancer="round-robin"), noise=False, router=hop)
    workload = Workload(num_requests=400, rate=60.0, prompt="uniform:16:64", output="uniform:4:16")
    one, asked = simulate(workload, config, seed=2, workers=1), simulate(workload, config, seed=2, workers=4)
    assert np.array_equal(one.columns["finish"], asked.columns["finish"])


def test_the_router_line_reads_its_hop_at_a_number_of_streams():
    hop = RouterCost(admission_s=0.003, delivery_s=0.001, admission_per_stream_s=4e-5, delivery_per_stream_s=5e-5)
    assert hop.per_stream and not RouterCost(0.003, 0.001).per_stream
    assert hop.admission_seconds(10) == pytest.approx(0.0034) and hop.delivery_seconds(10) == pytest.approx(0.0015)
    assert "3.00 ms + 40.0 us per stream" in hop.describe()


@pytest.mark.parametrize("field", ["admission_s", "delivery_s", "admission_per_stream_s", "delivery_per_stream_s"])
def test_a_negative_or_missing_hop_is_refused_by_name(field):
    with pytest.raises(ValueError, match=field):
        RouterCost(**{field: -0.001})
    with pytest.raises(ValueError, match=field):
        RouterCost(**{field: float("nan")})
