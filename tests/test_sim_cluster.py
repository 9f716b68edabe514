"""The simulated cluster: conservation, determinism, the scheduler comparison FastGen reports, and the
arrival processes."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import simpy

from engine.policy import PolicyConfig, Request, SamplingParams
from sim.cluster import ClusterConfig, simulate
from sim.costs import ConstantCost, LinearCost, load_cost_model
from sim.metrics import summarize
from sim.replica import Replica
from sim.saturation import estimate_capacity
from sim.workload import LengthDist, RequestTable, Workload

SMALL = LinearCost(base=5e-3, per_token=2e-5, per_decode_context=1e-7, noise_sigma=0.05, num_kv_blocks=400)


def small_workload(n=400, rate=20.0, **kw):
    return Workload(num_requests=n, rate=rate, prompt=LengthDist("uniform", (10, 600)),
                    output=LengthDist("uniform", (1, 80)), **kw)


@pytest.mark.parametrize("scheduler, balancer", [("splitfuse", "round-robin"), ("splitfuse", "power-of-two"),
                                                 ("prefill-first", "least-tokens"), ("decode-first", "least-kv")])
def test_every_request_finishes_exactly_once_with_its_output(scheduler, balancer):
    w = small_workload()
    table = w.generate(seed=5)
    policy = PolicyConfig(scheduler=scheduler, token_budget=700, balancer=balancer)
    config = ClusterConfig(SMALL, replicas=3, policy=policy)
    result = simulate(w, config, seed=5)
    df = result.requests
    assert sorted(df["id"]) == list(range(len(table)))
    assert (df["output_tokens"].to_numpy() == table.output_tokens).all()
    assert (df["prompt_tokens"].to_numpy() == table.prompt_tokens).all()
    assert (df["arrival"] <= df["scheduled"]).all() and (df["scheduled"] < df["first_token"]).all()
    assert (df["first_token"] <= df["finish"]).all()
    assert result.replicas["requests"].sum() == len(table)
    assert result.tokens_per_pass.sum() == result.replicas["passes"].sum()
    # Every prompt and output token was computed once, plus whatever preemption made the replica recompute.
    computed = (np.arange(result.tokens_per_pass.shape[1]) * result.tokens_per_pass).sum()
    fed = (table.prompt_tokens + table.output_tokens - 1).sum()
    assert computed >= fed and (computed == fed) == (result.replicas["preemptions"].sum() == 0)


def test_preemption_shows_up_when_kv_is_short():
    tight = LinearCost(base=5e-3, per_token=2e-5, num_kv_blocks=60)
    config = ClusterConfig(tight, replicas=1, policy=PolicyConfig(token_budget=700))
    result = simulate(small_workload(rate=60.0), config, seed=1)
    assert result.replicas["preemptions"].sum() > 0
    assert result.requests["preemptions"].sum() == result.replicas["preemptions"].sum()
    assert result.replicas["peak_kv_usage"].max() > 0.9


def test_same_seed_same_result_and_different_seed_differs():
    config = ClusterConfig(SMALL, replicas=2, policy=PolicyConfig(balancer="random"))
    a = simulate(small_workload(), config, seed=3).requests
    b = simulate(small_workload(), config, seed=3).requests
    c = simulate(small_workload(), config, seed=4).requests
    pd.testing.assert_frame_equal(a, b)
    assert not a["finish"].equals(c["finish"])


def test_workload_seed_keeps_the_requests_while_seed_redraws_the_noise():
    config = ClusterConfig(SMALL, replicas=2, policy=PolicyConfig(balancer="random"))
    a = simulate(small_workload(), config, seed=3).requests
    b = simulate(small_workload(), config, seed=4, workload_seed=3).requests
    for column in ("arrival", "prompt_tokens", "output_tokens"):
        pd.testing.assert_series_equal(a[column], b[column])
    assert not a["finish"].equals(b["finish"])


def test_splitfuse_beats_prefill_first_on_fastgens_long_prompt_workload():
    cost = load_cost_model("llama-2-7b")
    w = Workload(num_requests=600, rate=1.0, prompt=LengthDist("normal", (2600, 0.3)),
                 output=LengthDist("normal", (128, 0.3)), max_prompt_tokens=4000)
    split_config = ClusterConfig(cost, replicas=1, policy=PolicyConfig(scheduler="splitfuse", token_budget=768))
    whole_config = ClusterConfig(cost, replicas=1, policy=PolicyConfig(scheduler="prefill-first", token_budget=4400))
    w.rate = 0.9 * estimate_capacity(split_config, w)
    split = summarize(simulate(w, split_config, seed=0))
    whole = summarize(simulate(w, whole_config, seed=0))
    assert split["effective_throughput_rps"] > whole["effective_throughput_rps"]
    assert split["itl_p95"] < whole["itl_p95"]


def in_flight_peak(df) -> int:
    events = np.concatenate([np.stack([df["arrival"], np.ones(len(df))], 1),
                             np.stack([df["finish"], -np.ones(len(df))], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # a finish before a send at the same instant
    return int(np.cumsum(events[:, 1]).max())


def test_closed_loop_clients_never_exceed_their_number():
    w = Workload(num_requests=300, arrivals="closed", clients=5, prompt=LengthDist("fixed", (100,)),
                 output=LengthDist("fixed", (10,)))
    df = simulate(w, ClusterConfig(SMALL, replicas=2, policy=PolicyConfig(balancer="round-robin")), seed=0).requests
    assert in_flight_peak(df) == 5
    assert len(df) == 300


def test_open_loop_max_concurrency_sends_in_arrival_order_under_the_cap():
    w = small_workload(n=300, rate=200.0, max_concurrency=3)
    config = ClusterConfig(SMALL, replicas=2, policy=PolicyConfig(balancer="round-robin"))
    df = simulate(w, config, seed=0).requests.sort_values("id")
    due = w.generate(0).arrivals
    assert in_flight_peak(df) == 3 and len(df) == 300
    assert (df.arrival.to_numpy() >= due - 1e-12).all() and df.arrival.is_monotonic_increasing  # FIFO
    assert (df.arrival.to_numpy() > due + 1).any()  # the cap held requests back, their latencies start when sent
    uncapped = simulate(dataclasses.replace(w, max_concurrency=None), config, seed=0).requests
    loose = simulate(dataclasses.replace(w, max_concurrency=300), config, seed=0).requests
    pd.testing.assert_frame_equal(loose, uncapped)


def test_a_capped_request_is_sent_when_the_client_has_the_last_token(tmp_path):
    """With one request in flight, each is sent at the later of its arrival and the last token of the one before
    (which reaches the client ``delivery`` after its pass)."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,5,3\n0.1,5,3\n0.2,5,3\n5,5,3\n")
    cost = ConstantCost(0.01, admission_s=0.25, delivery_s=0.125)
    workload = Workload(trace=trace, max_concurrency=1)
    df = simulate(workload, ClusterConfig(cost, policy=PolicyConfig()), seed=0).requests.sort_values("id")
    finish = df.finish.to_numpy()
    assert df.arrival.tolist() == pytest.approx([0.0, finish[0], finish[1], 5.0])
    assert df.e2e.tolist() == pytest.approx([0.25 + 3 * 0.01 + 0.125] * 4)


def test_max_concurrency_is_for_open_loops_and_positive():
    with pytest.raises(ValueError, match="a closed loop's cap is its --clients"):
        Workload(arrivals="closed", clients=2, max_concurrency=2).validate()
    with pytest.raises(ValueError, match="--max-concurrency must be >= 1"):
        Workload(rate=1.0, max_concurrency=0).validate()


def test_gamma_arrivals_are_burstier_than_poisson():
    def cv(arrivals):
        gaps = np.diff(arrivals)
        return gaps.std() / gaps.mean()

    poisson = Workload(num_requests=20000, rate=10.0).generate(0).arrivals
    bursty = Workload(num_requests=20000, arrivals="gamma", rate=10.0, cv=3.0).generate(0).arrivals
    assert cv(poisson) == pytest.approx(1.0, abs=0.05)
    assert cv(bursty) == pytest.approx(3.0, rel=0.1)
    assert 1 / np.diff(bursty).mean() == pytest.approx(10.0, rel=0.1)


def test_shared_prefixes_hit_the_prefix_cache():
    n = 200
    table = RequestTable(np.arange(n) * 0.05, np.full(n, 512), np.full(n, 8),
                         prefix_ids=np.array(["system"] * n, dtype=object), prefix_lens=np.full(n, 480))
    cached = simulate(table, ClusterConfig(SMALL, replicas=1), seed=0).requests
    no_cache = ClusterConfig(SMALL, replicas=1, policy=PolicyConfig(enable_prefix_caching=False))
    uncached = simulate(table, no_cache, seed=0).requests
    assert cached["cached_tokens"].iloc[1:].eq(480).all() and uncached["cached_tokens"].eq(0).all()
    assert cached["ttft"].mean() < uncached["ttft"].mean()


def test_per_replica_statistics():
    config = ClusterConfig(SMALL, replicas=3, policy=PolicyConfig(balancer="round-robin"))
    result = simulate(small_workload(), config, seed=0)
    reps = result.replicas
    assert list(reps["replica"]) == [0, 1, 2]
    assert ((reps["busy_share"] > 0) & (reps["busy_share"] <= 1)).all()
    assert set(result.kv["replica"]) == {0, 1, 2} and result.kv["kv_usage"].between(0, 1).all()


def test_every_cost_model_offers_what_the_simulator_needs():
    """``sim.costs.CostModel`` names what a replica uses; the shipped profiles and the analytic models have it."""
    from typing import get_type_hints

    from calibration.profile import load_profile
    from engine.policy import PassFeatures
    from sim.costs import CostModel, builtin_llama_2_7b

    features = PassFeatures(300, 200, 100, 104, 4, 100 * 1500, 200 * 900, 101)
    for cost in (load_profile("llama-2-7b"), builtin_llama_2_7b(), SMALL, ConstantCost(0.01)):
        for name in get_type_hints(CostModel):
            assert hasattr(cost, name), (type(cost).__name__, name)
        assert cost.predict(features) > 0
        factors = cost.noise_factors(np.random.default_rng(0).random(64))
        assert len(factors) == 64 and all(f > 0 for f in factors)


@pytest.mark.parametrize("clients", [0, 1])
def test_the_serving_paths_delays_fall_on_the_clients_times(clients):
    """A request reaches the engine ``admission`` after the client sent it, its tokens reach the client
    ``delivery`` after their pass: one request alone takes admission + its passes + delivery, as the client sees
    it, in open and in closed loop (where the next request waits for the last token to arrive)."""
    table = RequestTable(arrivals=None if clients else np.array([0.0, 10.0]), prompt_tokens=np.array([5, 5]),
                         output_tokens=np.array([3, 3]))
    cost = ConstantCost(0.01, admission_s=0.25, delivery_s=0.125)
    workload = Workload(num_requests=2, arrivals="closed", clients=1, prompt=LengthDist("fixed", (5,)),
                        output=LengthDist("fixed", (3,))) if clients else table
    df = simulate(workload, ClusterConfig(cost, policy=PolicyConfig()), seed=0).requests.sort_values("id")
    assert df.ttft.tolist() == pytest.approx([0.25 + 0.01 + 0.125] * 2)
    assert df.e2e.tolist() == pytest.approx([0.25 + 3 * 0.01 + 0.125] * 2)
    assert df.tpot.tolist() == pytest.approx([0.01, 0.01])
    if clients:  # the second request is sent once the first one's last token arrived
        assert df.arrival.iloc[1] == pytest.approx(df.finish.iloc[0])


def test_least_kv_adds_the_tokens_sent_since_the_last_report():
    """The router hears KV usage from its health checks (every ``kv_report_interval`` seconds) and adds the tokens
    it sent since: even with one report a minute, least-kv spreads requests instead of sending them all to the
    replica that was emptiest then; reported often, it spreads them too."""
    workload = small_workload(n=200, rate=40.0)  # 5 s of arrivals

    def counts(interval):
        policy = PolicyConfig(balancer="least-kv", kv_report_interval=interval)
        result = simulate(workload, ClusterConfig(SMALL, replicas=2, policy=policy, noise=False), seed=0)
        return np.bincount(np.asarray(result.columns["replica"]), minlength=2)

    assert counts(60.0).min() > 80
    assert counts(0.01).min() > 60
    with pytest.raises(ValueError, match="kv-report-interval"):
        PolicyConfig(kv_report_interval=0)


def test_the_routers_health_checks_start_at_a_phase_the_seed_draws():
    """The router's health checks keep their own clock: least-kv's choices change with the seed (with no pass-time
    noise, the phase of its KV reports is all the seed draws), and are the same for the same seed; a balancer that
    reads no reports routes alike whatever the seed."""
    workload = small_workload(n=120, rate=40.0)

    def routes(balancer, seed):
        config = ClusterConfig(SMALL, replicas=2, policy=PolicyConfig(balancer=balancer), noise=False)
        return np.asarray(simulate(workload, config, seed=seed, workload_seed=0).columns["replica"]).tolist()

    kv = [routes("least-kv", seed) for seed in range(4)]
    assert kv[0] == routes("least-kv", 0)
    assert len({tuple(r) for r in kv}) > 1
    assert len({tuple(routes("least-requests", seed)) for seed in range(4)}) == 1


def test_given_routes_send_each_request_to_its_replica():
    """``routes`` (a real router's choices, say) override the balancer; a route for each request, to a replica that
    exists, or a clear error."""
    workload = small_workload(n=30)
    config = ClusterConfig(SMALL, replicas=3, policy=PolicyConfig(balancer="least-requests"))
    given = [i * 7 % 3 for i in range(30)]
    result = simulate(workload, config, seed=2, routes=np.array(given))
    by_id = dict(zip(result.columns["id"].tolist(), result.columns["replica"].tolist()))
    assert [by_id[i] for i in range(30)] == given
    for bad in (given[:-1], [*given[:-1], 3], [*given[:-1], 1.0]):
        with pytest.raises(ValueError, match="routes must give each of the 30 requests a replica index"):
            simulate(workload, config, seed=2, routes=bad)


def test_a_replica_counts_a_prompt_unstarted_until_its_first_token():
    """What least-kv adds to a replica's KV report: the prompts it holds no token of yet, as the router counts them
    (sent, nothing streamed back)."""
    env = simpy.Environment()
    replica = Replica(env, 0, SMALL, PolicyConfig(token_budget=256), noise=False, on_finish=lambda request, r: None)
    requests = [Request(i, None, SamplingParams(max_tokens=3, ignore_eos=True), 0.0, num_prompt_tokens=500)
                for i in range(3)]
    for request in requests:
        replica.submit(request)
    seen = {replica.unstarted_tokens}
    while env.peek() < float("inf"):
        env.step()
        assert replica.unstarted_tokens == sum(r.num_prompt_tokens for r in requests if r.num_output_tokens == 0)
        seen.add(replica.unstarted_tokens)
    assert {1500, 0} < seen  # in chunks of 256 tokens, not all at once
