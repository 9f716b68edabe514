"""Replications over seeds, load sweeps (the latency-throughput curve), the steady-state capacity search (the
highest arrival rate whose SLA attainment meets a target and whose queue does not grow) and paired comparisons.

The search judges a rate from ``SearchConfig.replications`` independent runs, each summarised over its steady
window (``sim.steady_state``: MSER-5 leaves out the warm-up). A rate **meets** when the 95% interval of the share
meeting the SLA lies at or above the target, the interval of the queue's growth lies at or below ``max_growth``
(s of wait per s of run) and requests finish at least ``STEADY_RATIO`` as fast as they arrive; it **misses** when
the share's interval lies below the target, or the growth's above ``max_growth``, or the completion rate's below
``STEADY_RATIO`` of the arrivals. The share decides only once the runs are long enough: the batch means of
meeting the SLA correlate (lag 1) by at most ``MAX_LAG1``. Otherwise the run length doubles, up to
``max_requests_per_replica`` per replica. A rate meets only if it meets at two run lengths in a row (n, then
2n) with its share no lower at 2n than at n by more than ``share_tol``, so its verdict does not move with the run
length: just under saturation a latency limit's share can fall with the run's length long after the queue's growth
looks flat, which two short runs that both met did not show. A rate still undecided at the cap (or decided to
within the tolerances) counts as not meeting: the answer is a rate shown to hold, never one that merely did not
fail yet.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np

from sim.cluster import ClusterConfig, simulate
from sim.metrics import FEW_REPLICATIONS, SLA, meets_fastgen_sla, meets_goodput, summarize, t_interval
from sim.parallel import run_map
from sim.steady_state import BATCHES, batch_means, lag1_correlation, queue_trend, steady_window
from sim.units import bounds
from sim.workload import Workload

STEADY_RATIO = 0.95  # completions slower than this share of arrivals: the queue grows, the rate is not sustained
MAX_LAG1 = 0.2  # batch means more correlated than this (mean over replications): the runs are too short to judge


def replicate(workload: Workload, config: ClusterConfig, seeds, sla: SLA | None = None, **kwargs) -> list[dict]:
    """One summary per seed (independent replications)."""
    return [summarize(simulate(workload, config, seed=s, **kwargs), sla) for s in seeds]


def steady_summary(result, sla: SLA | None = None) -> dict:
    """``summarize`` over the run's steady window (MSER-5 warm-up left out), plus ``warmup_requests`` (how many
    measured requests the rule left out), ``queue_growth`` (s of queueing delay gained per s of run) and the lag-1
    autocorrelation of the batch means of meeting the SLA (``sla_share_lag1``, ``goodput_share_lag1``)."""
    sla = sla or SLA()
    c = result.columns
    keep = steady_window(c)
    out = summarize(result, sla, keep=keep)
    out["warmup_requests"] = int(np.count_nonzero(c["measured"]) - np.count_nonzero(keep))
    window = {name: col[keep] for name, col in c.items()}
    order = np.argsort(window["arrival"], kind="stable")
    window = {name: col[order] for name, col in window.items()}
    enough = order.size >= BATCHES
    delay = np.nan_to_num(window["queue_delay"], nan=0.0)
    out["queue_growth"] = queue_trend(window["arrival"], delay) if enough else float("nan")
    indicators = {"sla_share": meets_fastgen_sla(window, sla.generation_rate, sla)}
    if sla.goodput:
        indicators["goodput_share"] = meets_goodput(window, sla)
    for name, ok in indicators.items():
        out[f"{name}_lag1"] = lag1_correlation(batch_means(ok)) if enough else float("nan")
    return out


@dataclass(frozen=True)
class Replication:
    """One independent run: the unit of work a backend (``sim.parallel.run_map``) runs. Its seed is its own,
    so the result does not depend on which worker runs it."""

    workload: Workload
    config: ClusterConfig
    seed: int
    sla: SLA | None = None
    warmup: float = 0.0
    cooldown: float = 0.0


def run_replication(task: Replication) -> dict:
    """The steady-state summary of one ``Replication`` (in this process: the backend spreads the tasks)."""
    result = simulate(task.workload, task.config, seed=task.seed, warmup=task.warmup, cooldown=task.cooldown,
                      workers=1)
    return steady_summary(result, task.sla)


def run_summary(task: Replication) -> dict:
    """The plain summary of one ``Replication``: every measured request, warm-up included (a strict check)."""
    result = simulate(task.workload, task.config, seed=task.seed, warmup=task.warmup, cooldown=task.cooldown,
                      workers=1)
    return summarize(result, task.sla)


def rerun(workload: Workload, config: ClusterConfig, seeds, sla: SLA | None = None, **parallel) -> list[dict]:
    """``run_summary`` of ``workload`` on ``config`` for each of ``seeds``, through ``run_map``: an independent
    re-simulation of an answer."""
    return run_map(run_summary, [Replication(workload, config, s, sla) for s in seeds], **parallel)


def load_sweep(workload: Workload, config: ClusterConfig, rates, seeds=(0,), sla: SLA | None = None,
               progress: bool = False, backend: str = "local", processes: int | None = None,
               ray_address: str | None = None, warmup: float = 0.0, cooldown: float = 0.0):
    """A DataFrame with one row per (rate, seed): the latency-throughput curve, each run summarised over its steady
    window (``steady_summary``; with ``warmup_requests`` and ``queue_growth``). The runs go to ``backend``
    (``sim.parallel.run_map``); the frame is the same for every backend."""
    import pandas as pd

    rates = [float(r) for r in rates]
    for rate in rates:
        if not rate > 0:
            raise ValueError(f"--rates: every rate must be > 0, got {rate!r}")
    tasks = [Replication(dataclasses.replace(workload, rate=rate), config, s, sla, warmup, cooldown)
             for rate in rates for s in seeds]
    summaries = run_map(run_replication, tasks, backend, processes, ray_address, progress="sweep" if progress else None)
    return pd.DataFrame([{"rate": t.workload.rate, **s} for t, s in zip(tasks, summaries)])


@dataclass(frozen=True)
class SearchConfig:
    """How ``capacity_search`` decides a rate. ``target``: the share of requests that must meet the SLA
    (``column``: ``sla_share`` for FastGen's SLA, ``goodput_share`` for goodput limits). Run lengths are per
    replica of the cluster: the first ``requests_per_replica``, doubled while undecided up to
    ``max_requests_per_replica``. ``max_growth``: the queue growth (s/s) a sustained rate may show. A decision
    stops early when the share's interval is within ``share_tol`` and the growth's within ``max_growth`` / 2.
    The bisection stops when the rates that meet and miss are within ``rel_tol`` of each other."""

    target: float = 0.9
    column: str = "sla_share"
    replications: int = 5
    seed: int = 0
    requests_per_replica: int = 500
    max_requests_per_replica: int = 8000
    max_growth: float = 0.01
    share_tol: float = 0.01
    rel_tol: float = 0.03
    level: float = 0.95

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise ValueError(f"--sla-target must be a share in (0, 1], got {self.target!r}")
        if self.replications < 2:
            raise ValueError(f"the capacity search needs >= 2 replications for its intervals, got {self.replications}")
        if not 0 < 2 * self.requests_per_replica <= self.max_requests_per_replica:
            raise ValueError(f"run lengths: a rate meets at two lengths in a row, so the longest "
                             f"({self.max_requests_per_replica} requests per replica) must be at least twice the "
                             f"first ({self.requests_per_replica})")
        if not self.max_growth > 0 or not self.rel_tol > 0:
            raise ValueError("max_growth and rel_tol must be > 0")

    @property
    def seeds(self) -> range:
        return range(self.seed, self.seed + self.replications)


@dataclass
class Evaluation:
    """The verdict on one rate: ``meets``, ``misses`` or ``undecided`` (at the cap, or within the tolerances),
    with the run length it took and the intervals it rests on."""

    rate: float
    verdict: str
    requests: int  # per replication, at the decision
    share: tuple[float, float, float]  # mean, low, high
    growth: tuple[float, float, float]  # s/s
    achieved: tuple[float, float, float]  # completion rate / arrival rate
    warmup_requests: float  # median over replications
    summaries: list[dict] = field(repr=False, default_factory=list)

    def row(self) -> dict:
        return {"rate": self.rate, "verdict": self.verdict, "requests": self.requests,
                "share": self.share[0], "share_low": self.share[1], "share_high": self.share[2],
                "queue_growth": self.growth[0], "growth_low": self.growth[1], "growth_high": self.growth[2],
                "achieved_ratio": self.achieved[0], "warmup_requests": self.warmup_requests}


def judge(summaries: list[dict], search: SearchConfig) -> tuple[str, bool, dict]:
    """(verdict, whether the intervals are narrow enough to stop growing the runs, the intervals) of one rate's
    replications."""
    def interval(key):  # Student-t, cut to the metric's range (which holds the true value: decisions unchanged)
        mean, low, high = t_interval(np.array([s[key] for s in summaries], dtype=float), level=search.level)
        low, high = np.clip([low, high], *bounds(key))
        return float(mean), float(low), float(high)

    share = interval(search.column)
    growth = interval("queue_growth")
    achieved = interval("achieved_ratio")
    cap = search.max_growth
    long_enough = np.mean([s[f"{search.column}_lag1"] for s in summaries]) <= MAX_LAG1
    if growth[1] > cap or achieved[2] < STEADY_RATIO or (long_enough and share[2] < search.target):
        verdict = "misses"
    elif long_enough and share[1] >= search.target and growth[2] <= cap and achieved[0] >= STEADY_RATIO:
        verdict = "meets"
    else:
        verdict = "undecided"
    narrow = long_enough and share[2] - share[1] <= 2 * search.share_tol and growth[2] - growth[1] <= cap
    return verdict, narrow, {"share": share, "growth": growth, "achieved": achieved}


def is_confirmed(verdict: str, before: str | None, before_share: float | None, share: float,
                 search: SearchConfig) -> bool:
    """Whether a rate's ``verdict`` at a run length stands: a miss at once; a meet only after a meet at half the
    length (``before``, its mean share ``before_share``) whose share this one's ``share`` is within ``share_tol``
    of or above."""
    if verdict == "misses":
        return True
    return verdict == "meets" and before == "meets" and before_share - share <= search.share_tol


def evaluate(workload: Workload, config: ClusterConfig, rate: float, sla: SLA | None, search: SearchConfig,
             backend: str = "local", processes: int | None = None, ray_address: str | None = None) -> Evaluation:
    """Judge ``rate`` (``judge``), doubling the run length while undecided, up to the cap. A rate meets only when
    it meets at two run lengths in a row (n and 2n), its share not falling between them by more than ``share_tol``:
    a verdict that moves with the run length is no verdict."""
    replicas = config.replicas
    n = search.requests_per_replica * replicas
    cap = search.max_requests_per_replica * replicas
    before, before_share = None, None
    while True:
        w = dataclasses.replace(workload, rate=float(rate), num_requests=n)
        tasks = [Replication(w, config, s, sla) for s in search.seeds]
        summaries = run_map(run_replication, tasks, backend, processes, ray_address)
        for s in summaries:
            s["achieved_ratio"] = s["completion_rate_rps"] / s["arrival_rate_rps"]
        verdict, narrow, iv = judge(summaries, search)
        confirmed = is_confirmed(verdict, before, before_share, iv["share"][0], search)
        if confirmed or n >= cap or (verdict == "undecided" and narrow):
            if verdict == "meets" and not confirmed:
                verdict = "undecided"  # met only at the longest run allowed: not shown to hold
            return Evaluation(float(rate), verdict, n, iv["share"], iv["growth"], iv["achieved"],
                              float(np.median([s["warmup_requests"] for s in summaries])), summaries)
        before, before_share = verdict, iv["share"][0]
        n = min(2 * n, cap)


@dataclass
class Capacity:
    """``capacity_search``'s answer. ``rate``: the highest rate shown to meet (None: not even the lowest tried);
    ``misses_at``: the lowest rate shown to miss (None: none tried does). The sustainable rate lies between them;
    rates in between were undecided. ``evaluations``: every rate judged, in order."""

    rate: float | None
    misses_at: float | None
    evaluations: list[Evaluation]
    search: SearchConfig

    @property
    def requests(self) -> int | None:
        """The run length (per replication) that decided ``rate``."""
        return next((e.requests for e in self.evaluations if e.rate == self.rate), None)

    def frame(self):
        import pandas as pd

        return pd.DataFrame([e.row() for e in sorted(self.evaluations, key=lambda e: e.rate)])


def capacity_search(workload: Workload, config: ClusterConfig, sla: SLA | None = None,
                    search: SearchConfig | None = None, low: float | None = None, high: float | None = None,
                    backend: str = "local", processes: int | None = None, ray_address: str | None = None,
                    on_evaluation=None, max_steps: int = 24) -> Capacity:
    """The highest arrival rate that meets ``search.target`` in steady state (see the module's docstring), by
    bisection between a rate that meets and one that misses (found from ``low``/``high``, by default half and
    1.2x the estimated saturation rate, halving or growing them until they do). Assumes attainment falls with
    load. ``on_evaluation(Evaluation)`` is called after each rate is judged."""
    from sim.saturation import estimate_capacity

    search = search or SearchConfig()
    if search.replications < FEW_REPLICATIONS:
        warnings.warn(f"{search.replications} replications: intervals over fewer than {FEW_REPLICATIONS} are rough",
                      stacklevel=2)
    estimate = estimate_capacity(config, workload)
    low = low or 0.5 * estimate
    high = high or 1.2 * estimate
    if not 0 < low < high:
        raise ValueError(f"capacity search: need 0 < low < high, got {low!r}, {high!r}")
    judged: dict[float, Evaluation] = {}

    def verdict(rate: float) -> str:
        if rate not in judged:
            if len(judged) >= max_steps:
                raise RuntimeError(f"capacity search: no answer within {max_steps} rates: {sorted(judged)}")
            judged[rate] = evaluate(workload, config, rate, sla, search, backend, processes, ray_address)
            if on_evaluation:
                on_evaluation(judged[rate])
        return judged[rate].verdict

    while verdict(high) != "misses":
        high *= 1.5
    while verdict(low) != "meets":
        low /= 2
        if low < estimate / 64:
            return Capacity(None, min(r for r, e in judged.items() if e.verdict == "misses"),
                            list(judged.values()), search)
    # the highest rate that meets, below the lowest that does not
    ceiling = min(r for r, e in judged.items() if e.verdict != "meets" and r > low)
    while ceiling - low > search.rel_tol * low:
        mid = (low + ceiling) / 2
        low, ceiling = (mid, ceiling) if verdict(mid) == "meets" else (low, mid)
    # the lowest rate that misses, above the highest that does not
    floor = max(r for r, e in judged.items() if e.verdict != "misses" and r < high)
    high = min(r for r, e in judged.items() if e.verdict == "misses" and r > floor)
    while high - floor > search.rel_tol * floor:
        mid = (floor + high) / 2
        floor, high = (floor, mid) if verdict(mid) == "misses" else (mid, high)
    return Capacity(low, high, list(judged.values()), search)


def meets(means, target: float, column: str = "sla_share", max_growth: float = SearchConfig.max_growth):
    """Whether replications' means (a summary-like mapping, or a frame of them per rate) reach ``target`` in
    ``column`` in steady state: requests finished at least ``STEADY_RATIO`` as fast as they arrived and, where
    the frame has it, the queue grew by at most ``max_growth`` s per s (means only: ``capacity_search`` decides
    with intervals)."""
    steady = means["completion_rate_rps"] >= STEADY_RATIO * means["arrival_rate_rps"]
    if "queue_growth" in means:
        steady = steady & (means["queue_growth"] <= max_growth)
    return (means[column] >= target) & steady


def max_rate_meeting(sweep, target: float = 0.9, column: str = "sla_share") -> float | None:
    """The highest swept rate whose means over seeds ``meet`` the target; None if none does."""
    columns = [c for c in (column, "completion_rate_rps", "arrival_rate_rps", "queue_growth") if c in sweep]
    ok = meets(sweep.groupby("rate")[columns].mean(), target, column)
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
    value). Columns: mean, its interval (within the metric's range, ``sim.metrics.mean_interval``), the difference
    from the best with its Student-t interval (a difference has no range to leave), and ``decided``: the
    difference's interval excludes zero (True for the best itself when every other is decided)."""
    import pandas as pd

    from sim.metrics import mean_interval

    wide = frame.pivot_table(index=seed, columns=by, values=metric).dropna()
    means = wide.mean()
    best = means.idxmin() if lower_is_better else means.idxmax()
    rows = []
    for name in wide.columns:
        mean, low, high = mean_interval(wide[name].to_numpy(), level=level)
        diff, dlow, dhigh = t_interval((wide[name] - wide[best]).to_numpy(), level=level)
        rows.append({by: name, "mean": float(mean), "ci_low": float(low), "ci_high": float(high),
                     "diff_from_best": float(diff), "diff_low": float(dlow), "diff_high": float(dhigh),
                     "decided": bool(dlow > 0 or dhigh < 0), "replications": len(wide)})
    out = pd.DataFrame(rows).set_index(by)
    out.loc[best, "decided"] = bool(out.drop(index=best)["decided"].all())
    return out.sort_values("mean", ascending=lower_is_better)
