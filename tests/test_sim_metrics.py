"""FastGen's SLA statistics against pandas, the gap histogram, summaries and confidence intervals."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import LinearCost
from sim.metrics import SLA, confidence_intervals, parse_goodput, summarize, summary_table
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
    assert 1.0 <= ci.loc["x", "ci_low"] < 2.2 and 2.8 < ci.loc["x", "ci_high"] <= 4.0
    assert confidence_intervals(summaries).equals(ci)  # seeded: the same interval every time


def test_intervals_stay_inside_each_metric_range():
    """Before, three replications printed an SLA share up to 102% and preemptions down to -4.3 (Student-t)."""
    summaries = [{"seed": s, "sla_share": share, "preemptions": count}
                 for s, (share, count) in enumerate([(1.0, 0), (0.95, 0), (1.0, 12)])]
    ci = confidence_intervals(summaries)
    assert 0.95 <= ci.loc["sla_share", "ci_low"] <= ci.loc["sla_share", "ci_high"] <= 1.0
    assert ci.loc["preemptions", "ci_low"] >= 0 and ci.loc["preemptions", "ci_high"] <= 12
    table = summary_table(summaries, keys=["sla_share", "preemptions"])
    assert "102" not in table.to_string() and "-" not in table.iloc[:, 1].str.cat()


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
