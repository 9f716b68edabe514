"""Load-balancing policies: which replica gets the next request. The simulator's cluster and the
server's router use the same objects.

A policy sees one ``ReplicaLoad`` per replica and returns the index of the chosen one. ``loads`` may be any
sequence (the simulator passes a lazy view, so policies that ignore loads cost nothing per request).
Ties go to the lowest index, so a policy is deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class ReplicaLoad:
    """What a balancer may know about a replica.

    ``outstanding_tokens`` counts prompt plus requested output tokens of the requests sent and not finished;
    ``kv_usage`` is the share of its KV cache in use as far as the balancer can tell (``estimate_kv_usage``).
    """

    outstanding_requests: int
    outstanding_tokens: int
    kv_usage: float


def estimate_kv_usage(reported: float, outstanding_tokens: int, outstanding_at_report: int,
                      capacity_tokens: int, unstarted_at_report: int = 0) -> float:
    """A replica's KV usage as a balancer can know it: the ``reported`` share (replicas report only now and then,
    with the router's health checks), plus the prompt tokens of its requests that had not started at the report
    (``unstarted_at_report``: sent, no token back yet), plus the outstanding tokens it gained since (sent less
    finished), as shares of its ``capacity_tokens`` (0: unknown, the report alone).

    On the report alone least-kv herds: every request between two reports goes to the replica that was emptiest at
    the first. Without the unstarted prompts it herds near saturation: a replica that was just sent a run of
    requests holds few of their KV blocks yet (their prompts wait), so at the next report it reads emptiest again."""
    if capacity_tokens <= 0:
        return reported
    return max(0.0, reported + (unstarted_at_report + outstanding_tokens - outstanding_at_report) / capacity_tokens)


class LoadBalancer:
    name = "base"
    reads_kv_usage = False  # whether it decides by KV usage, which replicas report only now and then

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        raise NotImplementedError


class RoundRobin(LoadBalancer):
    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        self._next = 0

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        i = self._next % len(loads)
        self._next = i + 1
        return i


class Random(LoadBalancer):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        return self._rng.randrange(len(loads))


class _LeastBy(LoadBalancer):
    """The replica with the smallest ``key``; ties to the lowest index."""

    key = ""

    def __init__(self, seed: int = 0) -> None:
        pass

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        key = self.key
        best, best_value = 0, None
        for i in range(len(loads)):
            value = getattr(loads[i], key)
            if best_value is None or value < best_value:
                best, best_value = i, value
        return best


class LeastRequests(_LeastBy):
    name = "least-requests"
    key = "outstanding_requests"


class LeastTokens(_LeastBy):
    name = "least-tokens"
    key = "outstanding_tokens"


class LeastKV(_LeastBy):
    name = "least-kv"
    key = "kv_usage"
    reads_kv_usage = True


class PowerOfTwo(LoadBalancer):
    """Power of two choices (Mitzenmacher): sample two distinct replicas, keep the one with fewer outstanding
    requests (then fewer outstanding tokens)."""

    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, loads: Sequence[ReplicaLoad]) -> int:
        n = len(loads)
        if n == 1:
            return 0
        a, b = self._rng.sample(range(n), 2)
        if a > b:
            a, b = b, a
        la, lb = loads[a], loads[b]
        if (lb.outstanding_requests, lb.outstanding_tokens) < (la.outstanding_requests, la.outstanding_tokens):
            return b
        return a


BALANCERS = {cls.name: cls for cls in (RoundRobin, Random, LeastRequests, LeastTokens, LeastKV, PowerOfTwo)}


def make_balancer(name: str, seed: int = 0) -> LoadBalancer:
    """Build a balancer by name: one of ``BALANCERS``."""
    try:
        cls = BALANCERS[name]
    except KeyError:
        raise ValueError(f"unknown balancer {name!r} (--balancer); choose one of {', '.join(sorted(BALANCERS))}") \
            from None
    return cls(seed)
