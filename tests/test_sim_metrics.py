"""FastGen's SLA statistics against pandas, the gap histogram, summaries and confidence intervals."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import LinearCost
from sim.metrics import SLA, confidence_intervals, parse_goodput, summarize
from sim.token_stats import GapHistogram, gap_stats
from sim.workload import LengthDist, Workload

token_lists = st.lists(st.lists(st.floats(1e-4, 5.0), min_size=1, max_size=60), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(token_lists)
def test_gap_stats_match_pandas_ewm_and_fastgens_cumulative_rule(increments):
    times = [list(np.cumsum(x)) for x in increments]
    max_ewm, max_mean, gaps = gap_stats(times)
    for i, t in enumerate(times):
        g = np.diff(t)
        want_ewm = pd.Series(g).ewm(span=16).mean().max() if len(g) else 0.0
        want_mean = max(((t[k] - t[0]) / k for k in range(1, len(t))), default=0.0)
        assert max_ewm[i] == pytest.approx(want_ewm, rel=1e-9, abs=1e-12)
        assert max_mean[i] == pytest.approx(want_mean, rel=1e-9, abs=1e-12)
    assert len(gaps) == sum(len(t) - 1 for t in times)


def test_gap_histogram_percentiles_are_within_a_bin():
    rng = np.random.default_rng(0)
    gaps = rng.lognormal(np.log(0.02), 0.7, 100_000)
    h = GapHistogram()
    h.add(gaps[:50_000])
    h.add(gaps[50_000:])
    for q in (50, 90, 99):
        assert h.percentile(q) == pytest.approx(np.percentile(gaps, q), rel=0.025)
    assert h.mean() == pytest.approx(gaps.mean(), rel=1e-12)


def test_sla_and_goodput_follow_their_definitions():
    cost = LinearCost(base=0.01, per_token=1e-4, noise_sigma=0.2, num_kv_blocks=2000)
    w = Workload(num_requests=500, rate=8.0, prompt=LengthDist("uniform", (50, 2000)),
                 output=LengthDist("uniform", (1, 100)))
    config = ClusterConfig(cost, replicas=1, policy=PolicyConfig(token_budget=512))
    result = simulate(w, config, seed=0, warmup=0.1, cooldown=0.1)
    sla = SLA(generation_rate=30.0, goodput={"ttft": 0.5, "tpot": 0.03})
    s = summarize(result, sla)
    m = result.requests[result.requests["measured"]]
    assert s["requests"] == len(m) == 400 and m["id"].min() == 50
    ok = (m["ttft"] <= m["prompt_tokens"] / 512) & ((m["output_tokens"] == 1) | (m["max_ewm_gap"] < 1 / 30))
    throughput = len(m) / (m["finish"].max() - m["arrival"].min())
    assert s["throughput_rps"] == pytest.approx(throughput)
    assert s["sla_share"] == pytest.approx(ok.mean()) and 0 < s["sla_share"] < 1
    assert s["effective_throughput_rps"] == pytest.approx(throughput * ok.mean())
    good = (m["ttft"] <= 0.5) & ~(m["tpot"] > 0.03)
    assert s["goodput_rps"] == pytest.approx(good.sum() / (m["finish"].max() - m["arrival"].min()))
    cumulative = summarize(result, SLA(generation_rate=30.0, cumulative=True))
    cum_ok = (m["ttft"] <= m["prompt_tokens"] / 512) & (m["max_mean_gap"] <= 1 / 30)
    assert cumulative["sla_share"] == pytest.approx(cum_ok.mean())
    assert s["ttft_p50"] == pytest.approx(np.percentile(m["ttft"], 50))


def test_confidence_interval_covers_the_mean_over_seeds():
    summaries = [{"seed": s, "x": v} for s, v in enumerate([1.0, 2.0, 3.0, 4.0])]
    ci = confidence_intervals(summaries)
    assert ci.loc["x", "mean"] == 2.5
    assert ci.loc["x", "ci_low"] == pytest.approx(2.5 - 3.182446 * np.std([1, 2, 3, 4], ddof=1) / 2, rel=1e-5)


def test_goodput_takes_vllms_syntax_and_milliseconds():
    # vllm bench serve --goodput ttft:200 tpot:50: space-separated pairs, milliseconds (the old parser read seconds)
    assert parse_goodput("ttft:200 tpot:50") == {"ttft": 0.2, "tpot": 0.05}
    assert parse_goodput(["ttft:500", "e2el:10000"]) == {"ttft": 0.5, "e2e": 10.0}
    with pytest.raises(ValueError, match="not comma-separated seconds"):
        parse_goodput("ttft:2,tpot:0.1")  # the old form must not be read silently in new units
    with pytest.raises(ValueError, match="must be >= 0 ms"):
        parse_goodput("ttft:-1")


def test_goodput_spec_errors_name_the_flag():
    with pytest.raises(ValueError, match="--goodput"):
        parse_goodput("ttft=0.5")
    with pytest.raises(ValueError, match="--goodput"):
        parse_goodput("itl:0.5")


def test_capacity_search_brackets_the_sla_target_in_steady_state():
    from sim.capacity import capacity_search, load_sweep, max_rate_meeting, meets

    cost = LinearCost(base=0.01, per_token=1e-4, num_kv_blocks=2000)
    w = Workload(num_requests=200, rate=1.0, prompt=LengthDist("fixed", (400,)), output=LengthDist("fixed", (20,)))
    config = ClusterConfig(cost, replicas=1, noise=False, policy=PolicyConfig(token_budget=512))
    sla = SLA(generation_rate=8.0)
    best = capacity_search(w, config, low=0.5, high=2.0, target=0.9, sla=sla, rel_tol=0.05)
    sweep = load_sweep(w, config, [best, best * 1.15], sla=sla)
    assert list(meets(sweep, 0.9)) == [True, False]
    assert max_rate_meeting(sweep, 0.9) == best
