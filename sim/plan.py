"""Capacity plans: the cheapest fleet that meets an SLA at a target request rate (``splitfuse plan``).

1. Each candidate replica (profile x scheduler x token budget) gets its sustainable rate from the steady-state
   capacity search on one replica (``sim.capacity.capacity_search``): the highest rate shown to meet the SLA target
   and the lowest shown to miss it. The cost model's own fit uncertainty scales both: the profile's measured points
   are resampled (bootstrap) and refitted, and the 2.5-97.5% range of the refit's estimated capacity over the
   original's (``sim.saturation.estimate_capacity``) widens the interval to
   [meets x low ratio, misses x high ratio].
2. Fleets: per balancer, ``ceil(target / rate)`` replicas of one card (an interval from the rate's interval), and
   for each pair of cards the cheapest mix of both (at least one of each) whose rates add up to the target. Cost is
   replicas x GPUs per replica x the price per GPU-hour of ``calibration/prices.csv`` (every price with its source).
3. From the cheapest, each fleet is checked whole by simulation at the target rate with seeds the search never
   used (``sim.capacity.evaluate``); a fleet that does not meet grows by one replica (the card with the cheaper
   rate) up to ``grow`` times. The first that meets is the pick.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calibration.host_spread import scheduler_name
from engine.policy import PolicyConfig
from sim.capacity import SearchConfig, capacity_search, evaluate
from sim.cluster import ClusterConfig
from sim.metrics import SLA
from sim.parallel import run_map
from sim.workload import Workload

PRICES = Path(__file__).resolve().parent.parent / "calibration" / "prices.csv"
PRICE_COLUMNS = ("profile", "card", "gpus_per_replica", "usd_per_gpu_hour", "source", "as_of")
CHECK_SEED = 10_000  # the fleet checks' seeds start here: none of the searches' (which start at SearchConfig.seed)
ENERGY_KEYS = ("energy_per_request_j", "fleet_power_w", "energy_kwh")


def load_prices(path: str | Path = PRICES):
    """The price table (one row per profile): its columns ``PRICE_COLUMNS``; ValueError naming a bad row."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prices: no such file {str(path)!r}")
    table = pd.read_csv(path)
    missing = [c for c in PRICE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"--prices {str(path)!r}: missing column(s) {', '.join(missing)}")
    for i, row in table.iterrows():
        if not (row["usd_per_gpu_hour"] > 0 and row["gpus_per_replica"] >= 1) or not str(row["source"]).strip():
            raise ValueError(f"--prices {str(path)!r} line {i + 2}: need a price > 0, gpus_per_replica >= 1 and a "
                             f"source (row: {dict(row)})")
    return table.set_index("profile")


@dataclass(frozen=True)
class PlanConfig:
    """What to plan: ``target_rate`` (requests/s) over ``profiles`` (priced in ``prices``) x ``schedulers``
    ((name, token budget) pairs) x ``balancers``, with mixed fleets of two cards when ``mixed``.
    ``fit_resamples``: bootstrap refits of each profile's cost model. Checks run ``check_replications`` runs of
    ``check_requests_per_replica`` requests per replica (doubled up to 4x while undecided). ``host_margin``: plan
    for hosts whose passes run this share slower than the profile's (0.04: 4%), in the search and the checks alike
    (``sim.costs.SlowerHost``); None: each profile's margin for the workload's ``mix`` and the candidate's
    scheduler (``margin``).
    ``mix``: the named mix the workload draws (``sim.workload.mix_name``; None: none of them, any mix's runs count)."""

    target_rate: float
    profiles: tuple[str, ...]
    schedulers: tuple[tuple[str, int], ...] = (("splitfuse", PolicyConfig.max_num_batched_tokens),)
    balancers: tuple[str, ...] = (PolicyConfig.balancer,)
    mixed: bool = True
    fit_resamples: int = 20
    check_replications: int = 3
    check_requests_per_replica: int = 100
    grow: int = 2
    usd_per_kwh: float = 0.10
    prices: str | Path = PRICES
    host_margin: float | None = None
    mix: str | None = None

    def __post_init__(self) -> None:
        if not self.target_rate > 0:
            raise ValueError(f"--rate must be a positive number of requests per second, got {self.target_rate!r}")
        if not self.profiles:
            raise ValueError("--profile: no candidate profiles")
        if self.fit_resamples < 0 or self.grow < 0:
            raise ValueError("--fit-resamples and grow must be >= 0")
        if self.host_margin is not None and not 0 <= self.host_margin < 1:
            raise ValueError(f"--host-margin must be a share in [0, 1), e.g. 0.04 for hosts 4% slower, got "
                             f"{self.host_margin!r}")

    def margin(self, profile: str, scheduler: str | None = None, token_budget: int | None = None) -> float:
        """The share by which ``profile``'s replicas running ``scheduler`` at ``token_budget`` are planned slower:
        ``host_margin`` where given, else the profile's ``host_margin`` for ``mix`` and that scheduler: its slowest
        measured run of them, or the bound a new host of its card stays under where larger
        (``calibration.host_spread``; the mix's runs of every scheduler where none of this one was measured, or no
        scheduler is named; any mix's runs where none of ``mix`` was; 0 where no host was)."""
        if self.host_margin is not None:
            return self.host_margin
        margin = getattr(_cost(profile), "host_margin", None)
        if margin is None:
            return 0.0
        return margin(self.mix, scheduler_name(scheduler, token_budget) if scheduler else None)


@dataclass
class ReplicaCapacity:
    """One candidate replica's sustainable rate (req/s) and its interval (replications and fit uncertainty)."""

    profile: str
    scheduler: str
    token_budget: int
    rate: float | None
    low: float | None
    high: float | None
    misses_at: float | None
    fit_ratio: tuple[float, float]  # 2.5 and 97.5 percentiles of refit / original estimated capacity
    evaluations: object = field(repr=False, default=None)  # the search's frame

    @property
    def key(self) -> tuple[str, str, int]:
        return self.profile, self.scheduler, self.token_budget


def fit_ratio(profile: str, workload: Workload, policy: PolicyConfig, resamples: int, seed: int = 0,
              parallel: dict | None = None) -> tuple[float, float]:
    """The 2.5 and 97.5 percentiles, over ``resamples`` bootstrap refits of the profile's cost model on its own
    measured points, of the refit's estimated capacity over the original's ((1, 1) without points or resamples)."""
    from sim.costs import load_cost_model

    cost = load_cost_model(profile)
    if not resamples or not getattr(cost, "points", None):
        return 1.0, 1.0
    ratios = run_map(_refit_ratio, [(profile, workload, policy, seed + i) for i in range(resamples)],
                     **(parallel or {}))
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def _refit_ratio(task) -> float:
    from calibration.fitting import build_profile
    from calibration.profile import Profile
    from sim.costs import load_cost_model
    from sim.saturation import estimate_capacity

    profile, workload, policy, seed = task
    cost = load_cost_model(profile)
    rng = np.random.default_rng([seed, 0xB007])
    points = [cost.points[i] for i in rng.integers(0, len(cost.points), len(cost.points))]
    refit = build_profile(points, cost.meta, cost.block_size, cost.num_kv_blocks, cost.max_model_len,
                          heldout_frac=0.0, seed=seed)
    refit = Profile(cost.meta, cost.block_size, cost.num_kv_blocks, cost.max_model_len, refit.model,
                    noise=cost.noise, serving=cost.serving)  # the serving path is not what is resampled
    one = estimate_capacity(ClusterConfig(cost, replicas=1, policy=policy), workload)
    return estimate_capacity(ClusterConfig(refit, replicas=1, policy=policy), workload) / one


def replica_capacity(profile: str, scheduler: str, budget: int, workload: Workload, sla: SLA, search: SearchConfig,
                     plan: PlanConfig, parallel: dict, on_evaluation=None) -> ReplicaCapacity:
    """``ReplicaCapacity`` of one replica of ``profile`` running ``scheduler`` at ``budget``."""
    policy = PolicyConfig(scheduler=scheduler, token_budget=budget)
    margin = plan.margin(profile, scheduler, budget)
    cost = host_cost(profile, 1 + margin) if margin else profile  # a name travels light
    config = ClusterConfig(cost, replicas=1, policy=policy)
    answer = capacity_search(workload, config, sla, search, on_evaluation=on_evaluation, **parallel)
    lo, hi = fit_ratio(profile, workload, policy, plan.fit_resamples, search.seed, parallel)
    rate, misses = answer.rate, answer.misses_at
    return ReplicaCapacity(profile, scheduler, budget, rate, rate * lo if rate else None,
                           misses * hi if misses else None, misses, (lo, hi), answer.frame())


@dataclass
class Fleet:
    """A candidate fleet: replicas per profile, one policy."""

    counts: dict[str, int]
    scheduler: str
    token_budget: int
    balancer: str
    usd_per_hour: float
    replicas_low: int
    replicas_high: int
    check: object = None  # sim.capacity.Evaluation of the whole fleet, once checked
    host_factors: dict[str, float] = field(default_factory=dict)  # hosts' pass time over each profile's (1 absent)

    @property
    def replicas(self) -> int:
        return sum(self.counts.values())

    def name(self, prices) -> str:
        return " + ".join(f"{n} x {prices.loc[p, 'card']}" for p, n in self.counts.items())

    def cluster(self) -> ClusterConfig:
        """The fleet as a cluster: the cards interleaved, so that no balancer sees them in blocks."""
        slots = sorted(((k + 0.5) / n, p) for p, n in self.counts.items() for k in range(n))
        policy = PolicyConfig(scheduler=self.scheduler, token_budget=self.token_budget, balancer=self.balancer)
        return ClusterConfig([host_cost(p, self.host_factors.get(p, 1.0)) for _, p in slots], replicas=len(slots),
                             policy=policy)


@functools.lru_cache(maxsize=16)
def _cost(profile: str):
    """A profile's cost model, loaded once (a fleet shares it between its replicas)."""
    from sim.costs import load_cost_model

    return load_cost_model(profile)


def host_cost(profile: str, factor: float = 1.0):
    """The profile's cost model on a host whose passes take ``factor`` times as long (the profile itself at 1)."""
    from sim.costs import SlowerHost

    return _cost(profile) if factor == 1 else SlowerHost(_cost(profile), factor)


def usd_per_hour(counts: dict[str, int], prices) -> float:
    return float(sum(n * prices.loc[p, "gpus_per_replica"] * prices.loc[p, "usd_per_gpu_hour"]
                     for p, n in counts.items()))


def fleets(capacities: list[ReplicaCapacity], plan: PlanConfig, prices) -> list[Fleet]:
    """Every candidate fleet, cheapest first: one card, and (with ``plan.mixed``) the cheapest mix of two."""
    target = plan.target_rate
    out = []
    by_policy: dict[tuple[str, int], list[ReplicaCapacity]] = {}
    for c in capacities:
        if c.rate:
            by_policy.setdefault((c.scheduler, c.token_budget), []).append(c)
    for (scheduler, budget), caps in by_policy.items():
        options = []
        for c in caps:
            counts = {c.profile: math.ceil(target / c.rate)}
            low = math.ceil(target / c.high) if c.high else 1
            high = math.ceil(target / c.low)
            options.append((counts, low, high))
        if plan.mixed:
            for i, a in enumerate(caps):
                for b in caps[i + 1:]:
                    mix = cheapest_mix(a, b, target, prices)
                    if mix:
                        options.append(mix)
        for counts, low, high in options:
            for balancer in plan.balancers:
                out.append(Fleet(counts, scheduler, budget, balancer, usd_per_hour(counts, prices), low, high,
                                 host_factors={p: 1 + plan.margin(p, scheduler, budget) for p in counts}))
    return sorted(out, key=lambda f: (f.usd_per_hour, f.replicas))


def cheapest_mix(a: ReplicaCapacity, b: ReplicaCapacity, target: float, prices):
    """(counts, replicas low, replicas high) of the cheapest fleet with >= 1 replica of each of ``a`` and ``b``
    whose sustainable rates add up to ``target``; None if one card alone is always cheaper or as cheap."""
    best = None
    for na in range(1, math.ceil(target / a.rate)):
        nb = max(1, math.ceil((target - na * a.rate) / b.rate))
        counts = {a.profile: na, b.profile: nb}
        cost = usd_per_hour(counts, prices)
        if best is None or cost < best[0]:
            best = (cost, counts)
    if best is None:
        return None
    counts = best[1]
    share = counts[a.profile] * a.rate / target  # the interval as if each card's share scaled with its rate
    low = math.ceil(target * share / a.high) + math.ceil(target * (1 - share) / b.high) if a.high and b.high else 2
    high = math.ceil(target * share / a.low) + math.ceil(target * (1 - share) / b.low)
    return counts, low, high


def check_fleet(fleet: Fleet, workload: Workload, sla: SLA, search: SearchConfig, plan: PlanConfig,
                parallel: dict):
    """The whole fleet at the target rate, with the check's fresh seeds (``sim.capacity.evaluate``)."""
    check = dataclasses.replace(search, replications=plan.check_replications, seed=CHECK_SEED,
                                requests_per_replica=plan.check_requests_per_replica,
                                max_requests_per_replica=4 * plan.check_requests_per_replica)
    return evaluate(workload, fleet.cluster(), plan.target_rate, sla, check, **parallel)


def grown(fleet: Fleet, capacities: dict, prices) -> Fleet:
    """``fleet`` with one more replica of its card whose sustainable rate is cheapest per req/s."""
    def usd_per_rate(profile):
        c = capacities[(profile, fleet.scheduler, fleet.token_budget)]
        return prices.loc[profile, "usd_per_gpu_hour"] * prices.loc[profile, "gpus_per_replica"] / c.rate

    pick = min(fleet.counts, key=usd_per_rate)
    counts = {**fleet.counts, pick: fleet.counts[pick] + 1}
    return dataclasses.replace(fleet, counts=counts, usd_per_hour=usd_per_hour(counts, prices),
                               replicas_low=fleet.replicas_low + 1, replicas_high=fleet.replicas_high + 1, check=None)


@dataclass
class Plan:
    capacities: list[ReplicaCapacity]
    candidates: list[Fleet]  # every fleet, cheapest first (checked ones carry their check)
    pick: Fleet | None
    prices: object = field(repr=False, default=None)

    def table(self, plan: PlanConfig):
        """The ranked candidates with units in the headers."""
        import pandas as pd

        rows = []
        for rank, f in enumerate(self.candidates, start=1):
            caps = [c for c in self.capacities if c.profile in f.counts and c.scheduler == f.scheduler
                    and c.token_budget == f.token_budget]
            row = {"rank": rank, "fleet": f.name(self.prices), "scheduler": f.scheduler,
                   "token budget (tokens)": f.token_budget, "balancer": f.balancer, "replicas": f.replicas,
                   "replicas 95% range": f"{f.replicas_low} to {f.replicas_high}",
                   "rate per replica (req/s)": " + ".join(f"{c.rate:.3g} ({c.low:.3g} to {c.high:.3g})"
                                                          if c.high else f"{c.rate:.3g} ({c.low:.3g} to ?)"
                                                          for c in caps),
                   "cost (USD/h)": round(f.usd_per_hour, 2),
                   "cost 95% range (USD/h)": (f"{f.usd_per_hour * f.replicas_low / f.replicas:.0f} to "
                                              f"{f.usd_per_hour * f.replicas_high / f.replicas:.0f}"),
                   "check": f.check.verdict if f.check else "not checked",
                   "SLA share at check (%)": round(100 * f.check.share[0], 1) if f.check else None}
            energy = _energy(f.check, plan) if f.check else {}
            row.update(energy)
            rows.append(row)
        return pd.DataFrame(rows).set_index("rank")


def _energy(check, plan: PlanConfig) -> dict:
    """kWh per hour and electricity cost of a checked fleet, where the summaries carry energy keys."""
    power = [s.get("fleet_power_w") for s in check.summaries]
    if any(p is None for p in power):
        return {}
    kw = float(np.mean(power)) / 1000
    per_request = np.mean([s.get("energy_per_request_j", np.nan) for s in check.summaries])
    return {"energy (kWh per hour)": round(kw, 2), "electricity (USD/h)": round(kw * plan.usd_per_kwh, 2),
            "energy per request (J)": round(float(per_request), 1)}


def make_plan(workload: Workload, sla: SLA, plan: PlanConfig, search: SearchConfig | None = None,
              parallel: dict | None = None, echo=print) -> Plan:
    """Search each candidate replica, size the fleets, check them cheapest first; ``echo`` reports progress."""
    search = search or SearchConfig()
    parallel = parallel or {}
    prices = load_prices(plan.prices)
    unpriced = [p for p in plan.profiles if p not in prices.index]
    if unpriced:
        raise ValueError(f"--profile {unpriced[0]!r} has no price in {plan.prices}: add a row (priced: "
                         f"{', '.join(prices.index)})")
    capacities = []
    for profile in plan.profiles:
        for scheduler, budget in plan.schedulers:
            echo(f"searching {profile}, {scheduler} at {budget} tokens per pass (one replica)")
            c = replica_capacity(profile, scheduler, budget, workload, sla, search, plan, parallel,
                                 on_evaluation=lambda e: echo(f"  {e.rate:9.4g} req/s: {e.verdict:9s} "
                                                              f"{e.requests:,} requests x {search.replications}"))
            if c.rate is None:
                echo("  no rate meets the SLA")
            else:
                high = f"{c.high:.4g}" if c.high else "?"
                echo(f"  sustainable: {c.rate:.4g} req/s per replica (95%: {c.low:.4g} to {high}; fit bootstrap "
                     f"ratio {c.fit_ratio[0]:.3f} to {c.fit_ratio[1]:.3f})")
            capacities.append(c)
    by_key = {c.key: c for c in capacities}
    candidates = fleets(capacities, plan, prices)
    pick, extra = None, []
    for fleet in candidates:
        for _ in range(plan.grow + 1):
            echo(f"checking {fleet.name(prices)} ({fleet.balancer}) at {plan.target_rate:g} req/s")
            fleet.check = check_fleet(fleet, workload, sla, search, plan, parallel)
            echo(f"  {fleet.check.verdict}: share {fleet.check.share[0]:.1%}, queue growth "
                 f"{fleet.check.growth[0]:+.4f} s/s, {fleet.check.requests:,} requests x {plan.check_replications}")
            if fleet.check.verdict == "meets":
                pick = fleet
                break
            fleet = grown(fleet, by_key, prices)
            extra.append(fleet)
        if pick:
            break
    candidates = sorted(candidates + [f for f in extra if f.check], key=lambda f: (f.usd_per_hour, f.replicas))
    return Plan(capacities, candidates, pick, prices)
