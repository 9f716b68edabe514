"""``splitfuse plan``: the cheapest fleet that meets an SLA at a target request rate (``sim.plan``)."""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path

import click

from calibration.host_spread import scheduler_name
from engine.policy import PolicyConfig, make_balancer, scheduler_class
from sim.capacity import SearchConfig
from sim.parallel_options import backend_options
from sim.plan import PRICES, PlanConfig
from sim.sla_options import SLA_CONTEXT, sla_options
from sim.workload import Workload


@click.command(context_settings=SLA_CONTEXT)
@click.option("--rate", type=float, required=True, help="Target request rate of the whole fleet, requests/s.")
@click.option("--model", default="llama-2-7b", show_default=True,
              help="Without --profile: every priced profile of this model.")
@click.option("--profile", "profiles", multiple=True, help="Candidate profile (repeat); must be priced in --prices.")
@click.option("--prices", type=click.Path(dir_okay=False), default=None,
              help="CSV of profile, card, gpus_per_replica, usd_per_gpu_hour, source, as_of (default: the shipped "
                   "calibration/prices.csv).")
@click.option("--scheduler", "schedulers", multiple=True, default=[f"splitfuse:{PolicyConfig.max_num_batched_tokens}"],
              show_default=True, help="Candidate scheduler and token budget, NAME:TOKENS (repeat).")
@click.option("--balancer", "balancers", multiple=True, default=[PolicyConfig.balancer], show_default=True,
              help="Candidate load balancer (repeat).")
@click.option("--mixed/--no-mixed", default=PlanConfig.mixed, show_default=True,
              help="Also consider fleets of two cards.")
@click.option("--prompt-len", default=str(Workload.prompt), show_default=True,
              help="fixed:N, uniform:LO:HI, normal:MEAN:REL, lognormal:MEAN:SIGMA or file:PATH:COLUMN.")
@click.option("--output-len", default=str(Workload.output), show_default=True, help="Same forms as --prompt-len.")
@click.option("--max-prompt-len", default=Workload.max_prompt_tokens, show_default=True, type=int)
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Take request lengths from this trace (CSV/JSONL); arrivals are Poisson at each rate tried.")
@sla_options
@click.option("--sla-target", default=SearchConfig.target, show_default=True, type=float,
              help="Share of requests that must meet the SLA (the goodput limits when --goodput is given).")
@click.option("--replications", default=SearchConfig.replications, show_default=True, type=int,
              help="Runs per rate in each replica's capacity search.")
@click.option("--max-requests-per-replica", default=4000, show_default=True, type=int,
              help="The longest run a search may grow to while undecided (requests per replica).")
@click.option("--fit-resamples", default=PlanConfig.fit_resamples, show_default=True, type=int,
              help="Bootstrap refits of each profile's cost model (its fit uncertainty).")
@click.option("--check-replications", default=PlanConfig.check_replications, show_default=True, type=int,
              help="Runs of each whole-fleet check (fresh seeds).")
@click.option("--check-requests-per-replica", default=PlanConfig.check_requests_per_replica, show_default=True,
              type=int, help="First run length of a fleet check, requests per replica (doubled up to 4x).")
@click.option("--usd-per-kwh", default=PlanConfig.usd_per_kwh, show_default=True, type=float,
              help="Electricity price, where the simulator reports energy.")
@click.option("--host-margin", default=PlanConfig.host_margin, type=float,
              help="Plan for hosts whose passes run this share slower than the profile's (0.04: 4%; 0: the "
                   "profile's own). Default: each profile's slowest measured run of the workload's mix where it "
                   "is a named one (long, short, fastgen), else of any mix, or where larger the bound 99% of its "
                   "card's hosts stay under (its 'hosts' section, with the card's spread pooled over its shipped "
                   "profiles; 0 where none was measured); hosts of one card differ by a few percent "
                   "(calibration/VALIDATION.md).")
@click.option("--seed", default=0, show_default=True, type=int)
@backend_options
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Write plan.csv, plan.json and plan.html (cost frontier, latency CDFs, SLA share) here.")
def plan(**options):
    """Find the cheapest fleet (replicas x scheduler x token budget x balancer x card, and mixes of two cards)
    that meets an SLA at a target request rate, with intervals from replications and the cost model's fit."""
    try:
        _run(**options)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _run(rate, model, profiles, prices, schedulers, balancers, mixed, prompt_len, output_len, max_prompt_len, trace,
         sla_gen_rate, sla_prompt_rate, cumulative_sla, goodput, sla_target, replications, max_requests_per_replica,
         fit_resamples, check_replications, check_requests_per_replica, usd_per_kwh, host_margin, seed, backend,
         processes, ray_address, out):
    from sim.metrics import SLA, few_replications_warning
    from sim.plan import load_prices, make_plan
    from sim.workload import mix_name

    start = time.perf_counter()
    prices = prices or PRICES
    table = load_prices(prices)
    profiles = tuple(profiles) or tuple(p for p in table.index if p.startswith(f"{model}-"))
    if not profiles:
        raise ValueError(f"--model {model!r}: no priced profile in {prices}; give --profile")
    parsed = tuple(_scheduler(s) for s in schedulers)
    for b in balancers:
        make_balancer(b)
    sla = SLA(prompt_tokens_per_s=sla_prompt_rate, generation_rate=sla_gen_rate, cumulative=cumulative_sla,
              goodput=goodput)
    workload = _workload(prompt_len, output_len, max_prompt_len, trace)
    column = "goodput_share" if sla.goodput else "sla_share"
    search = SearchConfig(target=sla_target, column=column, replications=replications, seed=seed,
                          max_requests_per_replica=max_requests_per_replica,
                          requests_per_replica=min(SearchConfig.requests_per_replica, max_requests_per_replica // 2))
    config = PlanConfig(rate, profiles, parsed, tuple(balancers), mixed, fit_resamples, check_replications,
                        check_requests_per_replica, usd_per_kwh=usd_per_kwh, prices=prices, host_margin=host_margin,
                        mix=mix_name(workload))
    for n in {replications, check_replications}:
        if few_replications_warning(n):
            click.echo(few_replications_warning(n))
    parallel = {"backend": backend, "processes": processes, "ray_address": ray_address}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the few-replications warning is printed above
        result = make_plan(workload, sla, config, search, parallel, echo=click.echo)
    ranked = result.table(config)
    click.echo(ranked.to_string())
    click.echo(_answer(result, config, search))
    elapsed = time.perf_counter() - start
    click.echo(f"planned in {elapsed:.0f} s")
    if out:
        options = {"rate": rate, "profiles": list(profiles), "schedulers": list(schedulers),
                   "balancers": list(balancers), "mixed": mixed, "host_margin": host_margin,
                   "host_mix": config.mix,
                   "host_margins": {p: {scheduler_name(*policy): config.margin(p, *policy) for policy in parsed}
                                    for p in profiles}, "seed": seed,
                   "backend": backend}
        _write(Path(out), result, config, ranked, workload, sla, search, elapsed, options)


def _answer(result, config, search) -> str:
    pick = result.pick
    if pick is None:
        return f"no candidate fleet met the SLA at {config.target_rate:g} req/s after its checks"
    policy = (pick.scheduler, pick.token_budget)
    hosts = f" on {_hosts(config, pick.counts, policy)}" if any(config.margin(p, *policy) for p in pick.counts) else ""
    return (f"cheapest fleet meeting the SLA ({search.target:.0%} of requests) at {config.target_rate:g} req/s{hosts}: "
            f"{pick.name(result.prices)}, {pick.scheduler} at {pick.token_budget} tokens per pass, {pick.balancer}: "
            f"{pick.replicas} replicas (95% range {pick.replicas_low} to {pick.replicas_high}), "
            f"{pick.usd_per_hour:.2f} USD/h; checked whole at {pick.check.requests:,} requests x "
            f"{config.check_replications} fresh seeds: share {pick.check.share[0]:.1%}")


def _write(out: Path, result, config, ranked, workload, sla, search, elapsed, options) -> None:
    from sim.cluster import simulate
    from sim.plan import CHECK_SEED
    from sim.plan_report import write_plan_report

    out.mkdir(parents=True, exist_ok=True)
    ranked.to_csv(out / "plan.csv")
    pick_results = []
    if result.pick:
        w = dataclasses.replace(workload, rate=config.target_rate, num_requests=result.pick.check.requests)
        pick_results = [simulate(w, result.pick.cluster(), seed=CHECK_SEED)]
    summary = {"options": options, "elapsed_s": elapsed, "answer": _answer(result, config, search),
               "capacities": [{**{k: v for k, v in c.__dict__.items() if k != "evaluations"},
                               "evaluations": c.evaluations.to_dict(orient="records")} for c in result.capacities],
               "candidates": json.loads(ranked.to_json(orient="records")),
               "pick": None if result.pick is None else {
                   "counts": result.pick.counts, "scheduler": result.pick.scheduler,
                   "token_budget": result.pick.token_budget, "balancer": result.pick.balancer,
                   "replicas": result.pick.replicas, "usd_per_hour": result.pick.usd_per_hour,
                   "replicas_low": result.pick.replicas_low, "replicas_high": result.pick.replicas_high,
                   "host_factors": result.pick.host_factors,
                   "check_requests": result.pick.check.requests, "check_share": result.pick.check.share}}
    (out / "plan.json").write_text(json.dumps(summary, indent=1, default=str))
    rows = {"target rate": f"{config.target_rate:g} req/s", "SLA target": f"{search.target:.0%} of requests",
            "SLA": str(sla), "workload": f"prompt {workload.prompt}, output {workload.output}",
            "hosts": _hosts(config, config.profiles, (result.pick.scheduler, result.pick.token_budget)
                            if result.pick else None),
            "answer": _answer(result, config, search), "_target": search.target}
    write_plan_report(out / "plan.html", result, config, ranked, pick_results, rows)
    click.echo(f"wrote {out}/plan.csv, {out}/plan.json, {out}/plan.html")


def _hosts(config, profiles, policy: tuple[str, int] | None = None) -> str:
    """Which hosts the plan is for, per profile, running ``policy`` (scheduler, token budget; None: any):
    "hosts 4.2% slower than llama-2-7b-h200-bf16's (its measured hosts of the long mix)"."""
    mix = f" of the {config.mix} mix" if config.mix else ""
    why = "as asked" if config.host_margin is not None else f"its measured hosts{mix}"
    return ", ".join(f"hosts {config.margin(p, *(policy or ())):.1%} slower than {p}'s ({why})" for p in profiles)


def _scheduler(text: str) -> tuple[str, int]:
    name, _, budget = text.partition(":")
    try:
        tokens = int(budget) if budget else PolicyConfig.max_num_batched_tokens
    except ValueError:
        raise ValueError(f"--scheduler {text!r}: expected NAME:TOKENS, e.g. splitfuse:768") from None
    scheduler_class(name)
    PolicyConfig(scheduler=name, token_budget=tokens)
    return name, tokens


def _workload(prompt_len, output_len, max_prompt_len, trace) -> Workload:
    if not trace:
        return Workload(prompt=prompt_len, output=output_len, max_prompt_tokens=max_prompt_len)
    from sim.workload import LengthDist, read_trace

    table = read_trace(trace)
    return Workload(prompt=LengthDist("file", (trace, "prompt_tokens", table.prompt_tokens)),
                    output=LengthDist("file", (trace, "output_tokens", table.output_tokens)), max_prompt_tokens=None)
