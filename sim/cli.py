"""``splitfuse simulate``: run the cluster simulator and print a summary (optionally a load sweep)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from engine.policy import PolicyConfig, make_balancer, scheduler_class
from engine.policy.options import config_options, pick
from sim.costs import DEFAULT_PROFILE
from sim.sla_options import sla_options


@click.command()
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help="Shipped profile name or profile JSON path (or builtin-llama-2-7b).")
@click.option("--replicas", default=4, show_default=True, type=int)
@config_options(PolicyConfig, exclude=("block_size",))  # the profile gives the block size the engine had
@click.option("--arrivals", default="poisson", show_default=True, help="poisson, gamma, closed or trace.")
@click.option("--rate", type=float, default=None, help="Arrival rate of the cluster, requests/s.")
@click.option("--load", type=float, default=0.8, show_default=True,
              help="Without --rate: this share of the estimated saturation rate.")
@click.option("--cv", type=float, default=1.0, show_default=True, help="Gamma arrivals' coefficient of variation.")
@click.option("--clients", type=int, default=0, help="Closed-loop clients (with --arrivals closed).")
@click.option("--trace", type=click.Path(dir_okay=False), default=None, help="CSV/JSONL trace to replay.")
@click.option("--num-requests", "-n", default=2000, show_default=True, type=int)
@click.option("--prompt-len", default="normal:2600:0.3", show_default=True,
              help="fixed:N, uniform:LO:HI, normal:MEAN:REL, lognormal:MEAN:SIGMA or file:PATH:COLUMN.")
@click.option("--output-len", default="normal:128:0.3", show_default=True, help="Same forms as --prompt-len.")
@click.option("--max-prompt-len", default=4000, show_default=True, type=int,
              help="Clip sampled prompts to this many tokens (FastGen's benchmark uses 4000).")
@click.option("--noise/--no-noise", default=True, show_default=True, help="Pass-time noise from the profile.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--replications", default=1, show_default=True, type=int,
              help="Independent runs (seeds seed..seed+R-1); prints 95% confidence intervals.")
@click.option("--warmup", default=0.0, show_default=True, type=float, help="Share of first requests left out.")
@click.option("--cooldown", default=0.0, show_default=True, type=float, help="Share of last requests left out.")
@sla_options
@click.option("--rates", default=None, help="Load sweep over these comma-separated rates (requests/s).")
@click.option("--sweep", default=0, type=int, help="Load sweep over this many rates from 0.2x to 1.2x capacity.")
@click.option("--sla-target", default=0.9, show_default=True, type=float,
              help="Share meeting the SLA that a sweep's best rate must reach.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Write requests.csv, summary.json and report.html here.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def simulate(**options):
    """Simulate a cluster of replicas on a calibrated profile.

    With no options: FastGen's long-prompt workload (prompts ~2,600, outputs ~128 tokens, 30% spread),
    Poisson at 80% of the estimated capacity of 4 replicas, Dynamic SplitFuse, on the llama-2-7b profile.
    """
    try:
        _run(**options)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _run(profile, replicas, arrivals, rate, load, cv, clients, trace, num_requests, prompt_len, output_len,
         max_prompt_len, noise, seed, replications, warmup, cooldown, sla_gen_rate, sla_prompt_rate, cumulative_sla,
         goodput, rates, sweep, sla_target, out, progress, **policy_options):
    options = {**locals(), **policy_options}
    del options["policy_options"]
    from sim.capacity import estimate_capacity, load_sweep, max_rate_meeting
    from sim.cluster import ClusterConfig, simulate
    from sim.costs import describe, load_cost_model
    from sim.metrics import SLA, SUMMARY_KEYS, confidence_intervals, parse_goodput, summarize
    from sim.workload import Workload, parse_length

    if progress is None:
        progress = sys.stderr.isatty()
    policy = PolicyConfig(**pick(PolicyConfig, policy_options))
    scheduler_class(policy.scheduler), make_balancer(policy.balancer)  # fail fast on a bad name
    if replications < 1:
        raise ValueError(f"--replications must be >= 1, got {replications}")
    if rate is not None and not rate > 0:
        raise ValueError(f"--rate must be a positive number of requests per second, got {rate}")
    if not 0 < load:
        raise ValueError(f"--load must be > 0, got {load}")
    cost = load_cost_model(profile)
    config = ClusterConfig(cost, replicas=replicas, policy=policy, noise=noise)
    config.costs()
    sla = SLA(prompt_tokens_per_s=sla_prompt_rate, generation_rate=sla_gen_rate, cumulative=cumulative_sla,
              goodput=parse_goodput(goodput))
    workload = Workload(num_requests=num_requests, arrivals=arrivals, rate=rate, cv=cv, clients=clients,
                        prompt=parse_length(prompt_len, "--prompt-len"),
                        output=parse_length(output_len, "--output-len"), trace=trace,
                        max_prompt_tokens=max_prompt_len)
    capacity = estimate_capacity(config, workload)
    if workload.arrivals in ("poisson", "gamma") and rate is None:
        workload.rate = load * capacity
    workload.validate()
    click.echo(f"profile: {describe(cost)}")
    if cost.meta.get("kind") != "measured":
        click.echo(f"  NOT a measured profile (kind {cost.meta.get('kind')!r}): {cost.meta.get('note', '')}")
    click.echo(f"cluster: {replicas} x {policy.scheduler} (token budget {policy.token_budget}), balancer "
               f"{policy.balancer}; "
               f"workload: {workload.arrivals}" + (f" at {workload.rate:.3g} req/s" if workload.rate else "")
               + f", {num_requests if arrivals != 'trace' else 'trace'} requests; est. capacity {capacity:.3g} req/s")

    kwargs = {"warmup": warmup, "cooldown": cooldown}
    sweep_df = None
    if rates or sweep:
        if arrivals not in ("poisson", "gamma"):
            raise ValueError("--rates/--sweep need open-loop arrivals (--arrivals poisson or gamma)")
        rate_list = _parse_rates(rates) if rates else [capacity * x for x in _linspace(0.2, 1.2, sweep)]
        sweep_df = load_sweep(workload, config, rate_list, range(seed, seed + replications), sla,
                              progress=progress, **kwargs)
        g = sweep_df.groupby("rate").mean(numeric_only=True)
        cols = ["throughput_rps", "ttft_p95", "tpot_p95", "itl_p95", "sla_share", "effective_throughput_rps"]
        click.echo(g[cols].to_string(float_format=lambda v: f"{v:.4g}"))
        best = max_rate_meeting(sweep_df, sla_target)
        click.echo(f"highest swept rate with >= {sla_target:.0%} of requests meeting the SLA: "
                   + (f"{best:.4g} req/s" if best is not None else "none"))
        workload.rate = best or rate_list[0]

    results = [simulate(workload, config, seed=s, progress=progress, **kwargs)
               for s in range(seed, seed + replications)]
    summaries = [summarize(r, sla) for r in results]
    if replications > 1:
        table = confidence_intervals(summaries)
        click.echo(table.loc[SUMMARY_KEYS].to_string(float_format=lambda v: f"{v:.4g}"))
    else:
        for key in SUMMARY_KEYS:
            click.echo(f"  {key:28s} {summaries[0][key]:.4g}")
        if "goodput_rps" in summaries[0]:
            click.echo(f"  {'goodput_rps':28s} {summaries[0]['goodput_rps']:.4g}")
    if out:
        from sim.report import write_report

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        columns = ["id", "replica", "arrival", "first_token", "finish", "prompt_tokens", "output_tokens",
                   "preemptions"]
        results[0].requests[columns].to_csv(out / "requests.csv", index=False)
        summary = {"profile": cost.meta, "options": options, "rate": workload.rate,
                   "runs": summaries}
        if sweep_df is not None:
            summary["sweep"] = sweep_df.to_dict(orient="records")
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        write_report(out / "report.html", results[0], summaries[0], sweep_df)
        click.echo(f"wrote {out}/requests.csv, summary.json, report.html")


def _parse_rates(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates {text!r}: expected comma-separated numbers") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"--rates {text!r}: every rate must be > 0")
    return values


def _linspace(lo: float, hi: float, n: int) -> list[float]:
    if n < 2:
        raise ValueError(f"--sweep needs at least 2 rates, got {n}")
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]
