"""Replications over seeds, load sweeps (the latency-throughput curve) and the capacity search (the highest
arrival rate whose SLA attainment meets a target)."""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.policy import BatchPlan, plan_features
from sim.cluster import ClusterConfig, simulate
from sim.metrics import SLA, summarize
from sim.workload import Workload


def estimate_capacity(config: ClusterConfig, workload: Workload) -> float:
    """Rough saturation rate (requests/s) of the cluster: every replica runs passes full of ``token_budget``
    tokens, mixing decodes and one prompt chunk in the workload's proportions. A starting point for sweeps, not a
    result."""
    rng = np.random.default_rng(0)
    p = float(workload.prompt.sample(rng, 4096).mean())
    o = float(workload.output.sample(rng, 4096).mean())
    budget = config.policy.token_budget
    decodes = min(round(budget * o / (p + o)), budget - 1)
    # decodes halfway through their outputs, and a chunk halfway through its prompt
    typical = BatchPlan(num_new_tokens=[1] * decodes + [budget - decodes],
                        start_positions=[p + o / 2 - 1] * decodes + [p / 2], num_decodes=decodes,
                        num_prefill_tokens=budget - decodes)
    features = plan_features(typical)
    return sum(budget / (p + o) / cost.predict(features) for cost in config.costs())


def replicate(workload: Workload, config: ClusterConfig, seeds, sla: SLA | None = None, **kwargs) -> list[dict]:
    """One summary per seed (independent replications)."""
    return [summarize(simulate(workload, config, seed=s, **kwargs), sla) for s in seeds]


def load_sweep(workload: Workload, config: ClusterConfig, rates, seeds=(0,), sla: SLA | None = None,
               progress: bool = False, **kwargs):
    """A DataFrame with one row per (rate, seed): the latency-throughput curve."""
    import pandas as pd

    rows = []
    rates = list(rates)
    for rate in _maybe_progress(rates, progress):
        if not rate > 0:
            raise ValueError(f"--rates: every rate must be > 0, got {rate!r}")
        w = dataclasses.replace(workload, rate=float(rate))
        for summary in replicate(w, config, seeds, sla, **kwargs):
            rows.append({"rate": float(rate), **summary})
    return pd.DataFrame(rows)


def max_rate_meeting(sweep, target: float = 0.9, column: str = "sla_share") -> float | None:
    """The highest swept rate whose mean ``column`` over seeds is at least ``target`` (None if none does)."""
    means = sweep.groupby("rate")[column].mean()
    ok = means[means >= target]
    return float(ok.index.max()) if len(ok) else None


def capacity_search(workload: Workload, config: ClusterConfig, low: float, high: float, target: float = 0.9,
                    seeds=(0,), sla: SLA | None = None, rel_tol: float = 0.02, column: str = "sla_share",
                    **kwargs) -> float:
    """Bisection on the arrival rate for the highest one whose mean ``column`` is at least ``target``
    (assumes attainment falls with load). Returns ``low`` if even ``low`` misses."""
    def ok(rate: float) -> bool:
        w = dataclasses.replace(workload, rate=rate)
        return float(np.mean([s[column] for s in replicate(w, config, seeds, sla, **kwargs)])) >= target

    if not ok(low):
        return low
    while ok(high):
        low, high = high, high * 2
    while high - low > rel_tol * low:
        mid = (low + high) / 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def _maybe_progress(items, progress: bool):
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="sweep", unit="rate", leave=False)
