"""A capacity answer holds in steady state and is bracketed by the sweep; comparisons are decided, not guessed."""

import numpy as np
import pandas as pd

from sim.capacity import capacity_answer, max_rate_meeting, paired_comparison


def sweep(rates, shares, ratios, seeds=3):
    rows = []
    for rate, share, ratio in zip(rates, shares, ratios):
        for seed in range(seeds):
            rows.append({"rate": rate, "seed": seed, "sla_share": share, "arrival_rate_rps": rate,
                         "completion_rate_rps": rate * ratio, "throughput_rps": rate * ratio})
    return pd.DataFrame(rows)


def test_the_answer_is_not_a_rate_whose_queue_grows():
    """Before, the notebook's answer was the top swept rate (8.03 req/s) whose throughput was 7.05: its queue grew,
    yet most requests still met the SLA in a short run."""
    s = sweep([4.0, 6.0, 8.0], shares=[1.0, 1.0, 0.95], ratios=[1.0, 0.99, 0.88])
    assert max_rate_meeting(s, 0.9) == 6.0
    assert capacity_answer(s, 0.9) == {"rate": 6.0, "bracketed": True, "next_rate": 8.0}


def test_the_top_of_a_sweep_is_reported_as_unbracketed():
    s = sweep([4.0, 6.0], shares=[1.0, 1.0], ratios=[1.0, 1.0])
    assert capacity_answer(s, 0.9) == {"rate": 6.0, "bracketed": False, "next_rate": None}
    assert capacity_answer(sweep([4.0], [0.5], [1.0]), 0.9)["rate"] is None


def test_paired_comparison_decides_what_overlapping_intervals_cannot():
    """Before, the balancer chart showed independent 2-seed intervals (reaching below zero, all overlapping).
    Seeds share arrivals across configurations, so the per-seed differences decide a real gap."""
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(2.0, 1.0, size=8)  # what the arrivals of a seed do to every configuration
    frame = pd.DataFrame([{"seed": i, "balancer": name, "ttft_p95": seed_effect[i] + gap + rng.normal(0, 0.02)}
                          for i in range(8) for name, gap in (("a", 0.0), ("b", 0.2), ("c", 0.21))])
    table = paired_comparison(frame, "balancer", "ttft_p95")
    assert list(table.index) == ["a", "b", "c"]
    assert table.loc["a", "ci_high"] > table.loc["b", "ci_low"]  # the plain intervals overlap...
    assert table.loc["b", "decided"] and table.loc["c", "decided"] and table.loc["a", "decided"]  # ...yet it is decided
    assert 0.15 < table.loc["b", "diff_from_best"] < 0.25 and table.loc["b", "diff_low"] > 0
    tied = paired_comparison(frame[frame.balancer != "a"], "balancer", "ttft_p95")
    assert not tied.loc["c", "decided"] and not tied.loc["b", "decided"]  # 0.01 apart: not decided
