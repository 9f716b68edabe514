from collections import Counter

import pytest

from engine.policy import BALANCERS, ReplicaLoad, estimate_kv_usage, make_balancer


def loads(*requests, tokens=None, kv=None):
    tokens = tokens or [0] * len(requests)
    kv = kv or [0.0] * len(requests)
    return [ReplicaLoad(r, t, k) for r, t, k in zip(requests, tokens, kv)]


def test_round_robin_cycles():
    b = make_balancer("round-robin")
    assert [b.choose(loads(0, 0, 0)) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_policies_pick_the_smallest_and_break_ties_low():
    ls = loads(3, 1, 1, 5, tokens=[10, 30, 20, 5], kv=[0.5, 0.2, 0.9, 0.1])
    assert make_balancer("least-requests").choose(ls) == 1
    assert make_balancer("least-tokens").choose(ls) == 3
    assert make_balancer("least-kv").choose(ls) == 3


def test_kv_usage_between_reports_adds_the_tokens_sent_since():
    assert estimate_kv_usage(0.25, 3000, 1000, 8000) == pytest.approx(0.5)  # 2,000 tokens more of 8,000
    assert estimate_kv_usage(0.25, 0, 4000, 8000) == 0.0  # more finished than sent: never below empty
    assert estimate_kv_usage(0.25, 3000, 1000, 0) == 0.25  # capacity unknown: the report alone
    # 1,000 prompt tokens had not started at the report (no KV blocks yet): they count on top of it
    assert estimate_kv_usage(0.25, 3000, 3000, 8000, unstarted_at_report=1000) == pytest.approx(0.375)
    # least-kv alternates between two replicas that reported the same usage, as their estimates grow in turn
    b, sent = make_balancer("least-kv"), [0, 0]
    for _ in range(6):
        i = b.choose([ReplicaLoad(0, s, estimate_kv_usage(0.1, s, 0, 10_000)) for s in sent])
        sent[i] += 500
    assert sent == [1500, 1500]


def test_random_is_uniform_and_seeded():
    b = make_balancer("random", seed=3)
    picks = [b.choose(loads(0, 0, 0, 0)) for _ in range(4000)]
    assert all(800 < c < 1200 for c in Counter(picks).values())
    again = make_balancer("random", seed=3)
    assert picks == [again.choose(loads(0, 0, 0, 0)) for _ in range(4000)]


def test_power_of_two_avoids_the_busiest_replica():
    b = make_balancer("power-of-two", seed=0)
    ls = loads(9, 0, 0, 0)
    assert 0 not in {b.choose(ls) for _ in range(200)}  # replica 0 loses every pair it is in
    assert make_balancer("power-of-two").choose(loads(4)) == 0


def test_unknown_balancer_lists_the_names():
    with pytest.raises(ValueError) as e:
        make_balancer("fastest")
    for name in BALANCERS:
        assert name in str(e.value)


def test_load_balancer_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, engine.policy.load_balancer, sim.cluster; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
