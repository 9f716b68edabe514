"""The cluster's rough saturation rate, and the arrival rate a run without one uses (``Workload.load`` of it)."""

from __future__ import annotations

import dataclasses

from engine.policy import BatchPlan, plan_features
from sim.workload import Workload


def estimate_capacity(config, workload: Workload) -> float:
    """Rough saturation rate (requests/s) of the cluster ``config`` (a ``sim.cluster.ClusterConfig``; not imported
    here, which ``sim.cluster`` imports): every replica runs passes full of ``max_num_batched_tokens``
    tokens, mixing decodes and one prompt chunk in the workload's proportions (its mean lengths: a trace's own, or
    the clipped sampled ones). A starting point for sweeps, not a result."""
    p, o = workload.mean_lengths()
    budget = config.policy.max_num_batched_tokens
    decodes = min(round(budget * o / (p + o)), budget - 1)
    # decodes halfway through their outputs, and a chunk halfway through its prompt
    typical = BatchPlan(num_new_tokens=[1] * decodes + [budget - decodes],
                        start_positions=[p + o / 2 - 1] * decodes + [p / 2], num_decodes=decodes,
                        num_prefill_tokens=budget - decodes)
    features = plan_features(typical)
    return sum(budget / (p + o) / cost.predict(features) for cost in config.costs())


def with_rate(workload: Workload, config) -> Workload:
    """``workload`` itself, or, for open-loop arrivals without a rate, a copy at ``workload.load`` x the
    cluster's estimated capacity (what ``splitfuse simulate`` without ``--rate`` runs)."""
    if workload.arrivals not in ("poisson", "gamma") or workload.rate is not None:
        return workload
    if not workload.load > 0:
        raise ValueError(f"--load must be > 0, got {workload.load!r}")
    return dataclasses.replace(workload, rate=workload.load * estimate_capacity(config, workload))
