"""Replications over seeds, load sweeps (the latency-throughput curve), the capacity search (the highest
arrival rate whose SLA attainment meets a target in steady state) and paired comparisons of configurations."""

from __future__ import annotations

import dataclasses

from sim.cluster import ClusterConfig, simulate
from sim.metrics import SLA, summarize, t_interval
from sim.workload import Workload


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


STEADY_RATIO = 0.95  # completions slower than this share of arrivals: the queue grows, the rate is not sustained


def meets(means, target: float, column: str = "sla_share"):
    """Whether replications' means (a summary-like mapping, or a frame of them per rate) reach ``target`` in
    ``column`` in steady state: requests finished at least ``STEADY_RATIO`` as fast as they arrived."""
    steady = means["completion_rate_rps"] >= STEADY_RATIO * means["arrival_rate_rps"]
    return (means[column] >= target) & steady


def max_rate_meeting(sweep, target: float = 0.9, column: str = "sla_share") -> float | None:
    """The highest swept rate whose means over seeds ``meet`` the target; None if none does."""
    ok = meets(sweep.groupby("rate")[[column, "completion_rate_rps", "arrival_rate_rps"]].mean(), target, column)
    return float(ok[ok].index.max()) if ok.any() else None


def capacity_answer(sweep, target: float = 0.9, column: str = "sla_share") -> dict:
    """``max_rate_meeting`` and whether the sweep decides it: ``bracketed`` when a higher swept rate exists (and
    so fails), i.e. the answer is not merely the top of the sweep. ``next_rate``: that higher rate."""
    best = max_rate_meeting(sweep, target, column)
    above = sorted(r for r in sweep["rate"].unique() if best is None or r > best)
    return {"rate": best, "bracketed": best is not None and bool(above), "next_rate": above[0] if above else None}


def paired_comparison(frame, by: str, metric: str, seed: str = "seed", lower_is_better: bool = True,
                      level: float = 0.95):
    """Each configuration (column ``by``) against the best one on ``metric``, paired by ``seed`` (the same seed
    gives every configuration the same arrivals and lengths, so the difference has much less noise than either
    value). Columns: mean, its interval, the difference from the best with its interval, and ``decided``: the
    difference's interval excludes zero (True for the best itself when every other is decided)."""
    import pandas as pd

    wide = frame.pivot_table(index=seed, columns=by, values=metric).dropna()
    means = wide.mean()
    best = means.idxmin() if lower_is_better else means.idxmax()
    rows = []
    for name in wide.columns:
        mean, low, high = t_interval(wide[name].to_numpy(), level=level)
        diff, dlow, dhigh = t_interval((wide[name] - wide[best]).to_numpy(), level=level)
        rows.append({by: name, "mean": float(mean), "ci_low": float(low), "ci_high": float(high),
                     "diff_from_best": float(diff), "diff_low": float(dlow), "diff_high": float(dhigh),
                     "decided": bool(dlow > 0 or dhigh < 0), "replications": len(wide)})
    out = pd.DataFrame(rows).set_index(by)
    out.loc[best, "decided"] = bool(out.drop(index=best)["decided"].all())
    return out.sort_values("mean", ascending=lower_is_better)


def capacity_search(workload: Workload, config: ClusterConfig, low: float, high: float, target: float = 0.9,
                    seeds=(0,), sla: SLA | None = None, rel_tol: float = 0.02, column: str = "sla_share",
                    **kwargs) -> float:
    """Bisection on the arrival rate for the highest one whose means over ``seeds`` ``meet`` the target (assumes
    attainment falls with load). Returns ``low`` if even ``low`` misses."""
    import pandas as pd

    def ok(rate: float) -> bool:
        w = dataclasses.replace(workload, rate=rate)
        return bool(meets(pd.DataFrame(replicate(w, config, seeds, sla, **kwargs)).mean(numeric_only=True), target,
                          column))

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
    from tqdm.auto import tqdm  # a widget in Jupyter, text on a terminal

    return tqdm(items, desc="sweep", unit="rate", leave=False)
