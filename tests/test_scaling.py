"""The scaling study's analysis: ratios against N x one replica and where scaling stops being linear."""

import pytest

from sim.scaling import linear_until, with_ratios


def row(balancer, replicas, effective, arrival):
    return {"balancer": balancer, "replicas": replicas, "completion_rate_rps": effective,
            "effective_throughput_rps": effective, "arrival_rate_rps": arrival}


def test_ratios_are_per_arrival_and_linear_until_names_the_last_n_above_the_threshold():
    rows = with_ratios([row("rr", 1, 5.0, 5.0), row("rr", 2, 10.2, 10.0), row("rr", 4, 18.0, 20.0),
                        row("kv", 2, 6.0, 10.0)])
    assert [r["effective_ratio"] for r in rows] == pytest.approx([1.0, 1.02, 0.9, 0.6])
    assert linear_until(rows, 0.95) == {"rr": 2, "kv": 1}
    assert linear_until(rows, 0.5) == {"rr": 4, "kv": 2}
